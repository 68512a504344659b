// The two mma.sync backward families' tile choices, by the shared memory an arch allows per block
// (the mma family's three classes: 99, 163 and 227 KB).
#pragma once

#include <string_view>

#include "flashjit/flashjit.hpp"

namespace flashjit::detail {

// tile_m query rows a step, tile_n keys per CTA, stages of Q/dO (bwd_mma) or K/V (bwd_mma_dq).
TileConfig bwd_mma_tiles_for(std::string_view arch, int head_dim);
TileConfig bwd_mma_dq_tiles_for(std::string_view arch, int head_dim);

}  // namespace flashjit::detail

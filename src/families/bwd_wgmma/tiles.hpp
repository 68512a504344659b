// The Hopper backward families' tile choices (one per head dim: sm_90a parts all allow 227 KB).
#pragma once

#include "flashjit/flashjit.hpp"

namespace flashjit::detail {

// bwd_wgmma: tile_m query rows a step, tile_n keys per CTA, stages of Q/dO.
TileConfig bwd_wgmma_tiles_for(int head_dim);
// bwd_wgmma_dq: tile_m query rows per CTA, tile_n keys a step, stages of K/V.
TileConfig bwd_wgmma_dq_tiles_for(int head_dim);

}  // namespace flashjit::detail

// The Hopper backward (kernels_src/bwd_wgmma/): bwd_wgmma computes dK and dV, bwd_wgmma_dq dQ,
// neither with atomics; Engine::backward pairs them in both modes.
#pragma once

#include <string_view>

#include "flashjit/flashjit.hpp"

namespace flashjit::detail {

// The dQ kernel that finishes bwd_wgmma's backward for outputs of this dtype and head dim.
Variant bwd_wgmma_dq_variant(std::string_view arch, DType dtype, int head_dim, bool causal);

}  // namespace flashjit::detail

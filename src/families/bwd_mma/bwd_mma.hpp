// The mma.sync backward (kernels_src/bwd_mma/): bwd_mma computes dK and dV (and dQ by atomics),
// bwd_mma_dq computes dQ alone for the deterministic mode. Engine::backward pairs them.
#pragma once

#include <string_view>

#include "flashjit/flashjit.hpp"

namespace flashjit::detail {

// The deterministic mode's dQ kernel for outputs of this dtype and head dim on an arch.
Variant bwd_mma_dq_variant(std::string_view arch, DType dtype, int head_dim, bool causal);

}  // namespace flashjit::detail

// The mma.sync backward (kernels_src/bwd_mma/): bwd_mma computes dK and dV (and dQ by atomics),
// bwd_mma_dq computes dQ alone for the deterministic mode. Engine::backward pairs them.
#pragma once

#include <string_view>

#include "flashjit/flashjit.hpp"

namespace flashjit::detail {

// The deterministic mode's dQ kernel after the bwd_mma variant `dkdv` (its arch, dtype, head dim,
// masks and score variants).
Variant bwd_mma_dq_variant(const Variant& dkdv);

}  // namespace flashjit::detail

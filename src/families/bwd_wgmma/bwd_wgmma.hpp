// The Hopper backward (kernels_src/bwd_wgmma/): bwd_wgmma computes dK and dV, bwd_wgmma_dq dQ,
// neither with atomics; Engine::backward pairs them in both modes.
#pragma once

#include <string_view>

#include "flashjit/flashjit.hpp"

namespace flashjit::detail {

// The dQ kernel that finishes the bwd_wgmma variant `dkdv`'s backward (its arch, dtype, head
// dim, masks and score variants).
Variant bwd_wgmma_dq_variant(const Variant& dkdv);

}  // namespace flashjit::detail

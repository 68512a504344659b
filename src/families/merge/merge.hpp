// The merge of partial attention results (kernels_src/merge/kernel.cu): split-KV partials after
// a decode launch, and Engine::merge_attention_states. Not an attention family: forward never
// dispatches to it; its variants are cached and precompiled like any other.
#pragma once

#include <string_view>

#include "cuda/launch.hpp"
#include "flashjit/flashjit.hpp"

namespace flashjit::detail {

// The merge variant for outputs of this dtype and head dim on an arch.
Variant merge_variant(std::string_view arch, DType dtype, int head_dim);
// One warp per row.
LaunchPlan merge_plan(long long rows);

}  // namespace flashjit::detail

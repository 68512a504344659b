// The backward pass's row passes (kernels_src/bwd_rows/kernel.cu): bwd_prep before the gradient
// kernels (dO·O row sums, the LSE in exp2 units, a zeroed dQ accumulator) and bwd_convert after
// them (the accumulator to dq). Not dispatched: Engine::backward runs them around its dK/dV
// family; their variants are cached and precompiled like any other.
#pragma once

#include <string_view>

#include "cuda/launch.hpp"
#include "flashjit/flashjit.hpp"

namespace flashjit::detail {

Variant bwd_prep_variant(std::string_view arch, DType dtype, int head_dim);
Variant bwd_convert_variant(std::string_view arch, DType dtype, int head_dim);
// The learnable sinks' gradient (BackwardOptions::d_sink_logits), after bwd_prep: a CTA per head.
Variant bwd_sink_variant(std::string_view arch, DType dtype, int head_dim);
LaunchPlan bwd_sink_plan(int heads_q);
// Every row of every (sequence, head), seqlen_q (the longest sequence's) padded to whole tiles
// (common/bwd_workspace.cuh), in the kernels' CTAs (bwd_rows/shape.cuh); a CTA past its own
// sequence's rows returns.
LaunchPlan bwd_prep_plan(int head_dim, int seqlen_q, int heads_q, int batch);
LaunchPlan bwd_convert_plan(int head_dim, int seqlen_q, int heads_q, int batch);

}  // namespace flashjit::detail

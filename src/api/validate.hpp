// Checks a forward call's arguments before anything is launched; produces the kernel params.
#pragma once

#include "flashjit/flashjit.hpp"
#include "core/problem.hpp"

namespace flashjit::detail {
// What `out` is to a validation: the view a forward writes (checked for overlap too), or a
// stand-in for its shape (queries that never write, e.g. the backward's workspace size).
enum class OutView { written, shape_only };
// Throws Error(invalid_argument) naming the argument and the expected value.
// varlen: null for equal-length batches.
ForwardProblem validate_forward(const TensorView& q, const KVCache& kv, const TensorView& out,
                                const VarlenBatch* varlen, const ForwardOptions& options,
                                OutView out_view = OutView::written);
// The three-tensor form: a dense KVCache.
ForwardProblem validate_forward(const TensorView& q, const TensorView& k, const TensorView& v,
                                const TensorView& out, const ForwardOptions& options);
// merge_attention_states' arguments as merge params; throws Error(invalid_argument).
MergeParams validate_merge(const TensorView& out_a, const float* lse_a, const TensorView& out_b,
                           const float* lse_b, const TensorView& out, float* lse_out);
}  // namespace flashjit::detail

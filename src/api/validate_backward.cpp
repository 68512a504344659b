#include "api/validate_backward.hpp"

#include <fmt/format.h>

#include <climits>
#include <cstdint>

#include "api/validate.hpp"
#include "api/view_checks.hpp"
#include "common/bwd_workspace.cuh"

namespace flashjit::detail {
namespace {

constexpr std::size_t kWorkspaceAlignment = 256;
// Far beyond any device, and small enough that the workspace's sums and roundings cannot wrap.
constexpr long long kMaxWorkspaceBytes = 1LL << 62;

std::size_t aligned(std::size_t bytes) {
  return (bytes + kWorkspaceAlignment - 1) / kWorkspaceAlignment * kWorkspaceAlignment;
}

// Where each part of the workspace starts (BackwardProblem::workspace_bytes says what they are):
// sizing and pointing read the same offsets.
struct WorkspaceLayout {
  std::size_t lse_log2, tile_counter, dq_accum, end;

  WorkspaceLayout(std::size_t rows, int head_dim, bool dq_accumulator) {
    lse_log2 = aligned(rows * sizeof(float));
    tile_counter = lse_log2 + aligned(rows * sizeof(float));
    dq_accum = tile_counter + aligned(sizeof(int));
    end = dq_accum + (dq_accumulator ? aligned(rows * head_dim * sizeof(float)) : 0);
  }
};

// The forward options of the forward being differentiated.
ForwardOptions forward_options(const BackwardOptions& options, const float* lse) {
  ForwardOptions forward;
  forward.softmax_scale = options.softmax_scale;
  forward.causal = options.causal;
  forward.lse = const_cast<float*>(lse);  // read, never written, by backward
  forward.softcap = options.softcap;
  forward.window_left = options.window_left;
  forward.window_right = options.window_right;
  forward.sink_tokens = options.sink_tokens;
  forward.alibi_slopes = options.alibi_slopes;
  forward.sink_logits = options.sink_logits;
  if (options.user_functions != nullptr && !options.user_functions->differentiable())
    reject(fmt::format("options.user_functions (hash {}) has a score_mod but no score_mod_grad: "
                       "expected the score_mod's derivative d score_mod / d score "
                       "(UserFunctions' third source) for the backward",
                       options.user_functions->hash()));
  forward.user_functions = options.user_functions;
  forward.user_args = options.user_args;
  if (options.block_mask != nullptr &&
      (options.user_functions == nullptr || !options.user_functions->has_mask_mod()))
    reject("options.block_mask is set without a mask_mod: expected user_functions with the "
           "mask_mod the block mask was built from (Engine::create_backward_block_mask)");
  return forward;
}

void check_gradient(const char* name, const TensorView& t, const TensorView& like,
                    const char* like_name) {
  check_view(name, t, like.dtype);
  for (int dim = 0; dim < 4; ++dim) expect_dim(name, t, dim, like.shape[dim], like_name);
}

BackwardProblem problem_of(const ForwardProblem& forward, const BackwardOptions& options) {
  BackwardProblem problem;
  problem.forward = forward;
  problem.deterministic = options.deterministic;
  problem.dq_accumulator = !options.deterministic;
  problem.params.fwd = forward.params;
  const long long rows = forward.varlen
                             ? BwdWorkspaceRows::packed_rows(forward.total_q, forward.batch)
                             : BwdWorkspaceRows::padded_rows(forward.seqlen_q);
  if (rows > INT_MAX)
    reject(fmt::format("the backward's workspace would hold {} rows per head: expected fewer than "
                       "2^31 (total_q {} and {} sequences, each padded to {} rows)",
                       rows, forward.total_q, forward.batch, BwdWorkspaceRows::kRowQuantum));
  problem.params.seqlen_rows = static_cast<int>(rows);
  // The workspace's largest part, the fp32 dQ accumulator, is rows x heads (x batch) x head_dim
  // floats: its byte count must fit (absurd shapes over overlapping strides pass every view check).
  long long accumulator_bytes = 0;
  const long long per_head = forward.varlen ? 1 : forward.batch;
  if (__builtin_mul_overflow(per_head * forward.heads_q, rows, &accumulator_bytes) ||
      __builtin_mul_overflow(accumulator_bytes, forward.head_dim * 4LL, &accumulator_bytes) ||
      accumulator_bytes > kMaxWorkspaceBytes)
    reject(fmt::format("the backward's workspace would hold {} x {} heads x {} rows x head_dim {} "
                       "fp32 values: expected at most 2^62 bytes",
                       per_head, forward.heads_q, rows, forward.head_dim));
  problem.params.dscore_scale = forward.softmax_scale;  // the forward's, whatever a cap made fwd's
  if (options.d_sink_logits != nullptr) {
    if (options.sink_logits == nullptr)
      reject("d_sink_logits is set but sink_logits is null: expected the forward's sink logits "
             "(device fp32 [heads_q]) whose gradient it receives");
    if (reinterpret_cast<std::uintptr_t>(options.d_sink_logits) % 4 != 0)
      reject("d_sink_logits is not 4-byte aligned: expected a device buffer of heads_q floats");
  }
  problem.params.dsink = options.d_sink_logits;
  // The gradient kernels need no sink variant (the LSE holds the sinks; bwd_sink reads
  // params.fwd.sink_logits for their gradient), so no family is refused for them.
  problem.forward.sink = false;
  return problem;
}

}  // namespace

std::size_t BackwardProblem::workspace_rows() const {
  return static_cast<std::size_t>(BwdWorkspaceRows::total_rows(forward.varlen, forward.batch,
                                                               forward.heads_q, params.seqlen_rows));
}

std::size_t BackwardProblem::workspace_bytes() const {
  return WorkspaceLayout(workspace_rows(), forward.head_dim, dq_accumulator).end;
}

BackwardParams BackwardProblem::with_workspace(void* workspace) const {
  const WorkspaceLayout layout(workspace_rows(), forward.head_dim, dq_accumulator);
  auto* bytes = static_cast<std::byte*>(workspace);
  BackwardParams p = params;
  p.delta = reinterpret_cast<float*>(bytes);
  p.lse_log2 = reinterpret_cast<float*>(bytes + layout.lse_log2);
  p.tile_counter = reinterpret_cast<int*>(bytes + layout.tile_counter);
  p.dq_accum = dq_accumulator ? reinterpret_cast<float*>(bytes + layout.dq_accum) : nullptr;
  return p;
}

BackwardProblem validate_backward(const TensorView& q, const TensorView& k, const TensorView& v,
                                  const TensorView& out, const TensorView& dout, const float* lse,
                                  const TensorView& dq, const TensorView& dk, const TensorView& dv,
                                  const VarlenBatch* varlen, const BackwardOptions& options) {
  if (lse == nullptr)
    reject(fmt::format("lse is null: expected the forward's fp32 LSE {} (ForwardOptions::lse)",
                       varlen != nullptr ? "[heads_q, total_q]" : "[batch, heads_q, seqlen_q]"));
  BackwardProblem problem = problem_of(
      validate_forward(q, KVCache::dense(k, v), out, varlen, forward_options(options, lse)),
      options);
  check_gradient("dout", dout, out, "the shape of out");
  check_gradient("dq", dq, q, "the shape of q");
  check_gradient("dk", dk, k, "the shape of k");
  check_gradient("dv", dv, v, "the shape of v");
  check_output_view("dq", dq);
  check_output_view("dk", dk);
  check_output_view("dv", dv);
  if (options.workspace != nullptr &&
      reinterpret_cast<std::uintptr_t>(options.workspace) % kWorkspaceAlignment != 0)
    reject(fmt::format("options.workspace ({}) is not {}-byte aligned", options.workspace,
                       kWorkspaceAlignment));
  BackwardParams& p = problem.params;
  p.dout = dout.data;
  p.dq = dq.data;
  p.dk = dk.data;
  p.dv = dv.data;
  p.do_stride_b = dout.stride[0], p.do_stride_s = dout.stride[1], p.do_stride_h = dout.stride[2];
  p.dq_stride_b = dq.stride[0], p.dq_stride_s = dq.stride[1], p.dq_stride_h = dq.stride[2];
  p.dk_stride_b = dk.stride[0], p.dk_stride_s = dk.stride[1], p.dk_stride_h = dk.stride[2];
  p.dv_stride_b = dv.stride[0], p.dv_stride_s = dv.stride[1], p.dv_stride_h = dv.stride[2];
  return problem;
}

BackwardProblem validate_backward(const TensorView& q, const TensorView& k, const TensorView& v,
                                  const VarlenBatch* varlen, const BackwardOptions& options) {
  // Any valid LSE address: only its alignment is checked here.
  static const float kSomeLse = 0.f;
  // q stands in for out's shape (q, an input, may overlap itself; an output may not).
  return problem_of(validate_forward(q, KVCache::dense(k, v), q, varlen,
                                     forward_options(options, &kSomeLse), OutView::shape_only),
                    options);
}

}  // namespace flashjit::detail

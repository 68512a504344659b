// Checks a backward call's arguments before anything is launched; produces the kernel params and
// the workspace's layout.
#pragma once

#include <cstddef>

#include "core/problem.hpp"
#include "flashjit/flashjit.hpp"

namespace flashjit::detail {

struct BackwardProblem {
  // The forward whose gradients these are (q, k, v, out, the scale and the mask), as forward
  // validates it.
  ForwardProblem forward;
  // Its params in params.fwd (lse: the forward's LSE, an input), the gradients'; the workspace's
  // pointers are set per call (workspace()).
  BackwardParams params{};
  bool deterministic = false;
  // The workspace holds the fp32 dQ accumulator: the kernels chosen sum dQ there by atomics (and
  // bwd_prep zeroes it, bwd_convert turns it into dq). The dispatcher sets it for the kernels it
  // picks (backward_kernels.hpp, uses_dq_accumulator); until then it is what bwd_mma needs, never
  // less than any choice needs.
  bool dq_accumulator = false;

  // The workspace: delta and lse_log2 (fp32 per padded row, common/bwd_workspace.cuh), the
  // dK/dV launch's tile counter (BackwardParams::tile_counter), then with dq_accumulator the
  // fp32 dQ accumulator (head_dim per padded row), each 256-byte aligned.
  std::size_t workspace_rows() const;
  std::size_t workspace_bytes() const;
  // params with its workspace pointers into `workspace` (workspace_bytes() of it).
  BackwardParams with_workspace(void* workspace) const;
};

// Throws Error(invalid_argument) naming the argument and the expected value. varlen: null for
// equal-length batches.
BackwardProblem validate_backward(const TensorView& q, const TensorView& k, const TensorView& v,
                                  const TensorView& out, const TensorView& dout, const float* lse,
                                  const TensorView& dq, const TensorView& dk, const TensorView& dv,
                                  const VarlenBatch* varlen, const BackwardOptions& options);
// The same for the queries that see only q, k and v (workspace size, variant): the rest is taken
// to have their shapes.
BackwardProblem validate_backward(const TensorView& q, const TensorView& k, const TensorView& v,
                                  const VarlenBatch* varlen, const BackwardOptions& options);

}  // namespace flashjit::detail

// A validated forward call: sizes, strides and options, independent of any kernel.
#pragma once

#include "common/params.cuh"
#include "flashjit/flashjit.hpp"

namespace flashjit::detail {

struct ForwardProblem {
  DType dtype = DType::bf16;
  int batch = 0, heads_q = 0, heads_kv = 0, seqlen_q = 0, seqlen_k = 0, head_dim = 0;
  bool causal = false;
  float softmax_scale = 1.f;
  FmhaParams params{};  // pointers and strides, ready for a kernel

  bool empty() const { return batch == 0 || heads_q == 0 || seqlen_q == 0; }
};

}  // namespace flashjit::detail

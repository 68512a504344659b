// Host mirror of kernels_src/common/params.cuh: the by-value argument block of every kernel.
#pragma once

#include <cstddef>
#include <cstdint>

namespace flashjit::detail {

struct FmhaParams {
  const void* q;
  const void* k;
  const void* v;
  void* o;
  float* lse;
  std::int64_t q_stride_b, q_stride_s, q_stride_h;
  std::int64_t k_stride_b, k_stride_s, k_stride_h;
  std::int64_t v_stride_b, v_stride_s, v_stride_h;
  std::int64_t o_stride_b, o_stride_s, o_stride_h;
  std::int32_t batch, heads_q, heads_kv, seqlen_q, seqlen_k;
  std::int32_t heads_per_kv;
  float scale_log2;
  float softmax_scale;
};

static_assert(sizeof(FmhaParams) == 5 * 8 + 12 * 8 + 6 * 4 + 2 * 4, "matches params.cuh");
static_assert(offsetof(FmhaParams, batch) == 136, "matches params.cuh");

}  // namespace flashjit::detail

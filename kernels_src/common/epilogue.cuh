// Per-row finish of the online softmax: output scale and log-sum-exp.
#pragma once

#include "common/fast_math.cuh"
#include "common/params.cuh"

namespace flashjit {

// 1/l, or 0 for a row that saw no key (l == 0), so such rows come out as 0 instead of NaN.
__device__ __forceinline__ float output_scale(float row_sum) {
  return row_sum > 0.f ? rcp_approx_ftz(row_sum) : 0.f;
}

// What a row's output is multiplied by, and what its natural-log LSE comes from: the row's
// total mass relative to 2^offset (log2 units). lse() is computed where it is stored, so the
// logarithm adds no live register to the output's conversion.
struct RowFinish {
  float scale, offset, total;

  __device__ __forceinline__ float lse() const {  // -inf for a row with no mass
    return total > 0.f ? (offset + log2_approx(total)) * kLn2F : neg_inf();
  }
};

// The end of a row's softmax from its running max (raw score units) and sum; with a sink
// (Variant::sink, `with_sink` false for the partial states that must not count it again) the
// head's sink logit s joins the denominator: top = max(m, s) in log2 units, the keys' share
// shrinks by 2^(m - top), and the sink adds 2^(s - top), so a sink far above the scores never
// overflows. A row that saw no key gets scale 0 and LSE s (-inf without a sink).
template <bool Sink>
__device__ __forceinline__ RowFinish finish_row(const FmhaParams& p, int head, float row_max,
                                                float row_sum, bool with_sink = true) {
  if (!Sink || !with_sink) return {output_scale(row_sum), row_max * p.scale_log2, row_sum};
  const float sink = __ldg(p.sink_logits + head) * kLog2e;
  const float keys = row_sum > 0.f ? row_max * p.scale_log2 : neg_inf();
  const float top = fmaxf(keys, sink);
  if (top == neg_inf()) return {0.f, 0.f, 0.f};  // no key and a sink of -inf
  const float kept = row_sum > 0.f ? exp2_ftz(keys - top) : 0.f;
  const float total = fmaf(row_sum, kept, exp2_ftz(sink - top));
  return {kept * rcp_approx_ftz(total), top, total};
}

// Where row `row` of a sequence keeps its LSE in p.lse: [batch, heads_q, seqlen_q] for dense
// batches, [heads_q, total_q] for varlen ones (the sequence's rows start at q_start), which only
// kernels built with Varlen take.
template <bool Varlen = false>
__device__ __forceinline__ long long lse_offset(const FmhaParams& p, int batch, int q_start,
                                                int head, int row) {
  if (Varlen && p.cu_seqlens_q != nullptr)
    return static_cast<long long>(head) * p.total_q + q_start + row;
  return (static_cast<long long>(batch) * p.heads_q + head) * p.seqlen_q + row;
}

// Writes one row's LSE into p.lse.
template <bool Varlen = false>
__device__ __forceinline__ void store_row_lse(const FmhaParams& p, int batch, int head, int row,
                                              float lse, int q_start = 0) {
  p.lse[lse_offset<Varlen>(p, batch, q_start, head, row)] = lse;
}

// exp2 argument offset for a row: the scaled max, or 0 while the row has seen only masked keys
// (max = -inf), which keeps exp2(-inf - -inf) = NaN out of the sums.
__device__ __forceinline__ float scaled_max(float row_max, float scale_log2) {
  return row_max == neg_inf() ? 0.f : row_max * scale_log2;
}

}  // namespace flashjit

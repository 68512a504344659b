// One sequence of a batch as the attention kernels see it: how many queries and valid keys it has
// and where its rows start, for dense batches (sequence b is batch index b of q, k, v and o) and
// varlen ones (rows packed through cu_seqlens_q / cu_seqlens_k), with seqused_k applied.
#pragma once

#include "common/params.cuh"

namespace flashjit {

// What the masks need (common/masking.cuh).
struct SequenceLengths {
  int seqlen_q, seqlen_k;
};

// The lengths the masks read: a varlen sequence's own, or (dense) the launch's, read from the
// params (`launch`) where used rather than copied into registers up front.
template <bool Varlen, typename Launch>
__device__ __forceinline__ const auto& mask_lengths(const SequenceLengths& sequence,
                                                    const Launch& launch) {
  if constexpr (Varlen)
    return sequence;
  else
    return launch;
}

struct SequenceSpan {
  int seqlen_q, seqlen_k;  // its queries, and the keys they attend over
  int q_start, k_start;    // its first row in a packed q / o and k / v; 0 when dense
  int q_batch, k_batch;    // its batch index in q / o and k / v; 0 when packed

  __device__ __forceinline__ SequenceLengths lengths() const { return {seqlen_q, seqlen_k}; }
};

// Lengths are clamped to the launch's seqlen_q / seqlen_k (the host's maxima, which size the grid
// and the key capacity), so a bad cu_seqlens entry cannot send a kernel past its tensors.
// PerSequence false (kernels built for dense batches only): the launch's lengths, nothing read.
template <bool PerSequence = true>
__device__ __forceinline__ SequenceSpan sequence_span(const FmhaParams& p, int batch) {
  SequenceSpan s{p.seqlen_q, p.seqlen_k, 0, 0, batch, batch};
  if (!PerSequence) return s;
  if (p.cu_seqlens_q != nullptr) {
    s.q_start = __ldg(p.cu_seqlens_q + batch);
    s.seqlen_q = min(max(__ldg(p.cu_seqlens_q + batch + 1) - s.q_start, 0), p.seqlen_q);
    s.q_batch = 0;
  }
  if (p.cu_seqlens_k != nullptr) {
    s.k_start = __ldg(p.cu_seqlens_k + batch);
    s.seqlen_k = min(max(__ldg(p.cu_seqlens_k + batch + 1) - s.k_start, 0), p.seqlen_k);
    s.k_batch = 0;
  }
  if (p.seqused_k != nullptr) s.seqlen_k = min(max(__ldg(p.seqused_k + batch), 0), s.seqlen_k);
  return s;
}

// The lengths a kernel masks with: the span's when built for per-sequence lengths, else the
// launch's read from the params where used (the same values as the span's, but kernels' code stays
// what it was before spans: copies held from the start cost dense kernels registers).
template <bool PerSequence>
__device__ __forceinline__ SequenceLengths lengths_of(const FmhaParams& p, const SequenceSpan& s) {
  if constexpr (PerSequence)
    return s.lengths();
  else
    return {p.seqlen_q, p.seqlen_k};
}

// The backward kernels' form: a varlen batch there always has both cu_seqlens (its keys are never
// paged) and no seqused_k, so nothing is tested at run time and the batch indices are known to be
// 0 (fewer live registers in kernels that have none to spare). Packed false: the launch's lengths.
template <bool Packed>
__device__ __forceinline__ SequenceSpan packed_sequence_span(const FmhaParams& p, int batch) {
  if (!Packed) return {p.seqlen_q, p.seqlen_k, 0, 0, batch, batch};
  const int q_start = __ldg(p.cu_seqlens_q + batch), k_start = __ldg(p.cu_seqlens_k + batch);
  return {min(max(__ldg(p.cu_seqlens_q + batch + 1) - q_start, 0), p.seqlen_q),
          min(max(__ldg(p.cu_seqlens_k + batch + 1) - k_start, 0), p.seqlen_k),
          q_start,
          k_start,
          0,
          0};
}

}  // namespace flashjit

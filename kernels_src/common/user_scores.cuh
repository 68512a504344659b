// Applying a kernel's user functions (common/user_functions.cuh) to its scores: score_mod on every
// score, mask_mod where a tile is masked. The functions see positions in the sequence clamped to
// it (a tile's rows past seqlen_q and keys past seqlen_k are computed but never kept), so user
// code indexing its arrays by q_idx or kv_idx stays inside them.
#pragma once

#include "common/fast_math.cuh"
#include "common/params.cuh"
#include "common/user_functions.cuh"

namespace flashjit {

constexpr bool kUserFunctions = user::kScoreMod || user::kMaskMod;

// Where a score_mod starts: raw scores to softmax_scale · q·k (soft-capped ones already are).
template <bool Softcap, int N>
__device__ __forceinline__ void scale_for_score_mod(float (&s)[N], const FmhaParams& p) {
  if constexpr (user::kScoreMod && !Softcap) {
#pragma unroll
    for (int e = 0; e < N; ++e) s[e] *= p.user_score_scale;
  }
}

template <bool Softcap, int MT, int NT>
__device__ __forceinline__ void scale_for_score_mod(float (&s)[MT][NT][4], const FmhaParams& p) {
  if constexpr (user::kScoreMod && !Softcap) {
#pragma unroll
    for (int mt = 0; mt < MT; ++mt)
#pragma unroll
      for (int nt = 0; nt < NT; ++nt)
#pragma unroll
        for (int e = 0; e < 4; ++e) s[mt][nt][e] *= p.user_score_scale;
  }
}

// One score: score_mod, then (Masked) mask_mod's -inf.
template <bool Masked>
__device__ __forceinline__ float user_score(float score, const FmhaParams& p, int batch, int head,
                                            int q_idx, int kv_idx) {
  if constexpr (user::kScoreMod) score = user::score_mod(score, batch, head, q_idx, kv_idx, p.user_args);
  if constexpr (Masked && user::kMaskMod)
    if (!user::mask_mod(batch, head, q_idx, kv_idx, p.user_args)) score = neg_inf();
  return score;
}

// The wgmma accumulator layout: s[e] is row `row` + 8 ((e / 2) % 2), key `key` + 8 (e / 4) + e % 2.
template <int N>
__device__ __forceinline__ void score_mod_wgmma(float (&s)[N], const FmhaParams& p, int batch,
                                                int head, int seqlen_q, int seqlen_k, int row,
                                                int key) {
  if constexpr (user::kScoreMod) {
    const int q_idx[2] = {min(row, seqlen_q - 1), min(row + 8, seqlen_q - 1)};
#pragma unroll
    for (int e = 0; e < N; ++e)
      s[e] = user::score_mod(s[e], batch, head, q_idx[(e / 2) % 2],
                             min(key + 8 * (e / 4) + e % 2, seqlen_k - 1), p.user_args);
  }
}

// mask_mod's verdicts on a thread's N scores of the wgmma layout, one bit each (set: hidden).
// Kernels take them before the scores exist, while the score registers are free: evaluated
// beside live scores, a mask_mod that loads per key spills.
template <int N>
struct MaskBits {
  unsigned word[(N + 31) / 32];
};
template <int N>
__device__ __forceinline__ MaskBits<N> mask_mod_wgmma(const FmhaParams& p, int batch, int head,
                                                      int seqlen_q, int seqlen_k, int row,
                                                      int key) {
  MaskBits<N> bits{};
  if constexpr (user::kMaskMod) {
    const int q_idx[2] = {min(row, seqlen_q - 1), min(row + 8, seqlen_q - 1)};
#pragma unroll
    for (int e = 0; e < N; ++e)
      if (!user::mask_mod(batch, head, q_idx[(e / 2) % 2],
                          min(key + 8 * (e / 4) + e % 2, seqlen_k - 1), p.user_args))
        bits.word[e / 32] |= 1u << (e % 32);
  }
  return bits;
}
template <int N>
__device__ __forceinline__ void apply_mask_bits(float (&s)[N], const MaskBits<N>& bits) {
  if constexpr (user::kMaskMod) {
#pragma unroll
    for (int e = 0; e < N; ++e)
      if (bits.word[e / 32] & (1u << (e % 32))) s[e] = neg_inf();
  }
}

// The m16n8 layout (mma.sync: s[mt][nt][2 h + e] is row (mt, h), key lane_key + 8 nt + e);
// row_of(mt, h) gives {q_idx, head} of a row, already clamped (decode packs heads into rows).
template <bool Masked, int MT, int NT, typename RowOf>
__device__ __forceinline__ void user_scores_m16n8(float (&s)[MT][NT][4], const FmhaParams& p,
                                                  int batch, RowOf row_of, int seqlen_k, int key) {
  if constexpr (kUserFunctions) {
#pragma unroll
    for (int mt = 0; mt < MT; ++mt)
#pragma unroll
      for (int h = 0; h < 2; ++h) {
        const auto row = row_of(mt, h);
#pragma unroll
        for (int nt = 0; nt < NT; ++nt)
#pragma unroll
          for (int e = 0; e < 2; ++e)
            s[mt][nt][2 * h + e] = user_score<Masked>(s[mt][nt][2 * h + e], p, batch, row.head,
                                                      row.q_idx,
                                                      min(key + 8 * nt + e, seqlen_k - 1));
      }
  }
}

// {q_idx, head} of one row for user_scores_m16n8.
struct UserRow {
  int q_idx, head;
};

}  // namespace flashjit

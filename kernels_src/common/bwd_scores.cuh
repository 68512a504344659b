// How every backward kernel recomputes the forward's probabilities: from a raw score x = q·k of
// (query row, key) and the row's lse_log2 (bwd_rows), P as the forward computed it, with the
// variants it was built with: soft-capping, ALiBi, the causal and sliding-window masks
// (StreamingLLM's sink tokens included). Learnable sinks need nothing here: the forward's LSE
// holds them. Plain variants keep P = exp2(x · scale_log2 - lse_log2) and only the causal test.
// The lengths are one sequence's (common/sequence.cuh): the launch's for equal-length batches.
// KeyEnd also masks keys past seqlen_k, for kernels whose tiles there hold other data than zeros
// (a varlen batch's next sequence) and reach dQ.
//
// Soft-capping: score = softcap · t, t = tanh(x · softcap_scale), so d score / dx = softmax_scale ·
// (1 - t²): kernels multiply dS by 1 - t² (capped()) and the gradients by the original
// softmax_scale (BackwardParams::dscore_scale), as without a cap.
#pragma once

#include "common/fast_math.cuh"
#include "common/params.cuh"
#include "common/sequence.cuh"
#include "common/softcap.cuh"

namespace flashjit {

template <bool Causal, bool Softcap, bool Window, bool Alibi, bool KeyEnd = false>
struct BackwardScores {
  static constexpr bool kMasks = Causal || Window || KeyEnd;
  const FmhaParams& f;
  int seqlen_k;
  int diagonal;      // seqlen_k - seqlen_q: query row i sits at key i + diagonal
  // Windows: row i sees key j iff lowest <= j - i <= highest, or j < sink_tokens up to highest.
  int lowest, highest;
  float slope_log2;  // ALiBi: the query head's slope, in log2 units of the logits

  __device__ __forceinline__ BackwardScores(const FmhaParams& params, SequenceLengths len,
                                            int head)
      : f(params),
        seqlen_k(len.seqlen_k),
        diagonal(len.seqlen_k - len.seqlen_q),
        lowest(Window ? diagonal - params.window_left : 0),
        highest(Window ? diagonal + params.window_right : 0),
        slope_log2(Alibi ? __ldg(params.alibi_slopes + head) * kLog2e : 0.f) {}

  // Whether some score of rows [row_lo, row_hi] x keys [key_lo, key_hi] is masked: only those
  // blocks pay for the per-score test.
  __device__ __forceinline__ bool any_masked(int row_lo, int row_hi, int key_lo,
                                             int key_hi) const {
    bool masked = (Causal && key_hi > row_lo + diagonal) || (KeyEnd && key_hi >= seqlen_k);
    if (Window)
      masked = masked || key_hi > row_lo + diagonal + f.window_right ||
               key_lo < row_hi + diagonal - f.window_left;
    return masked;
  }
  __device__ __forceinline__ bool visible(int row, int key) const {
    if (KeyEnd && key >= seqlen_k) return false;
    if (!Window) return !Causal || key <= row + diagonal;
    // key - row: one register plus constants over a thread's fragments.
    const int offset = key - row;
    return offset <= highest && (offset >= lowest || key < f.sink_tokens);
  }
  // The forward's P of raw score x at (row, key); soft-capped, also t (for capped()).
  __device__ __forceinline__ float prob(float x, float lse_log2, int row, int key, bool masked,
                                        float& t) const {
    float p;
    if constexpr (Softcap || Alibi) {
      float logit = x * f.scale_log2;
      if constexpr (Softcap) {
        t = tanh_accurate(x * f.softcap_scale);
        logit = f.softcap * t * f.scale_log2;
      }
      if constexpr (Alibi) logit -= slope_log2 * fabsf(static_cast<float>(row + diagonal - key));
      p = exp2_ftz(logit - lse_log2);
    } else {
      p = exp2_ftz(fmaf(x, f.scale_log2, -lse_log2));
    }
    if (kMasks && masked && !visible(row, key)) p = 0.f;
    return p;
  }
  // x times soft-capping's d score / d(scaled q·k), 1 - t² (x itself without a cap).
  __device__ __forceinline__ static float capped(float x, float t) {
    return Softcap ? x * (1.f - t * t) : x;
  }
  // dS = P ∘ (dP - delta), capped.
  __device__ __forceinline__ static float gradient(float p, float dp, float delta, float t) {
    return capped(p * (dp - delta), t);
  }
};

// The query tiles (TileM rows each) holding a row that sees some key of [key_lo, key_hi], for the
// dK / dV kernels' steps: tiles [first, first + count). Causal: from the tile where the diagonal
// reaches key_lo (every key is seen by the last row: count >= 1 whenever seqlen_q > 0). A window
// bounds both ends: key_lo <= i + d + window_right and key_hi >= i + d - window_left, unless the
// keys hold a sink token, which every row up to its right side sees.
template <bool Causal, bool Window, int TileM>
struct QueryTilesSeeing {
  int first, count;
  __device__ __forceinline__ QueryTilesSeeing(const FmhaParams& f, SequenceLengths len, int key_lo,
                                              int key_hi) {
    const int diagonal = len.seqlen_k - len.seqlen_q;
    if constexpr (Window) {
      int first_row = Causal ? key_lo - diagonal : 0, last_row = len.seqlen_q - 1;
      first_row = max(first_row, key_lo - diagonal - f.window_right);
      if (key_lo >= f.sink_tokens) last_row = min(last_row, key_hi - diagonal + f.window_left);
      first_row = max(first_row, 0);
      first = first_row / TileM;
      count = last_row < first_row ? 0 : last_row / TileM + 1 - first;
    } else {
      first = (Causal ? max(0, key_lo - diagonal) : 0) / TileM;
      count = max(0, (len.seqlen_q + TileM - 1) / TileM - first);
    }
  }
};

}  // namespace flashjit

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
// User functions (common/user_functions.cuh): score_mod takes the natural-log score after the cap
// and ALiBi, as in the forward, and its derivative score_mod_grad multiplies dS too; mask_mod
// hides keys on every tile (no block masks here: kMasks, any_masked). Both see positions clamped
// to the sequence, as the forward's (common/user_scores.cuh).
#pragma once

#include "common/fast_math.cuh"
#include "common/params.cuh"
#include "common/sequence.cuh"
#include "common/softcap.cuh"
#include "common/user_functions.cuh"

namespace flashjit {

// What the chain rule multiplies one score's dS by, from prob() to gradient() / capped(): the
// soft-cap's t (its factor is 1 - t²) and score_mod's derivative. Unused fields fold away.
struct ScoreDerivative {
  float tanh = 0.f;
  float mod = 1.f;
};

// Where user functions are evaluated: the sequence and query head, and the last row and key
// inside the sequence (the clamp). Empty without user functions (whose kernels never call these:
// they stand in for the `if constexpr` branches, which are checked though not taken).
template <bool UserFunctions>
struct UserSite {
  __device__ __forceinline__ UserSite(int, int, SequenceLengths) {}
  __device__ __forceinline__ float score_mod(float score, const FmhaParams&, int, int) const {
    return score;
  }
  __device__ __forceinline__ float score_mod_grad(float, const FmhaParams&, int, int) const {
    return 1.f;
  }
  __device__ __forceinline__ bool mask_mod(const FmhaParams&, int, int) const { return true; }
};
template <>
struct UserSite<true> {
  int batch, head, last_row, last_key;
  __device__ __forceinline__ UserSite(int batch_, int head_, SequenceLengths len)
      : batch(batch_), head(head_), last_row(len.seqlen_q - 1), last_key(len.seqlen_k - 1) {}
  __device__ __forceinline__ float score_mod(float score, const FmhaParams& f, int row,
                                             int key) const {
    return user::score_mod(score, batch, head, min(row, last_row), min(key, last_key),
                           f.user_args);
  }
  __device__ __forceinline__ float score_mod_grad(float score, const FmhaParams& f, int row,
                                                  int key) const {
    return user::score_mod_grad(score, batch, head, min(row, last_row), min(key, last_key),
                                f.user_args);
  }
  __device__ __forceinline__ bool mask_mod(const FmhaParams& f, int row, int key) const {
    return user::mask_mod(batch, head, min(row, last_row), min(key, last_key), f.user_args);
  }
};

template <bool Causal, bool Softcap, bool Window, bool Alibi, bool KeyEnd = false>
struct BackwardScores {
  static_assert(!user::kScoreMod || user::kScoreModGrad,
                "the backward of a score_mod needs its derivative: UserFunctions' score_mod_grad");
  static constexpr bool kUser = user::kScoreMod || user::kMaskMod;
  // User functions mask the keys past seqlen_k too: what a score_mod makes of their zero scores
  // is not bounded by the row's LSE, and could overflow P.
  static constexpr bool kKeyEnd = KeyEnd || kUser;
  static constexpr bool kMasks = Causal || Window || kKeyEnd || user::kMaskMod;
  // dS needs a factor of each score's own (ScoreDerivative): kernels then compute it in the pass
  // that makes P, after both GEMMs.
  static constexpr bool kPerScoreFactor = Softcap || user::kScoreMod;
  const FmhaParams& f;
  int seqlen_k;
  int diagonal;      // seqlen_k - seqlen_q: query row i sits at key i + diagonal
  // Windows: row i sees key j iff lowest <= j - i <= highest, or j < sink_tokens up to highest.
  int lowest, highest;
  float slope_log2;  // ALiBi: the query head's slope, in log2 units of the logits
  UserSite<kUser> user_site;

  // batch: the sequence (its index in a varlen batch), head: the query head.
  __device__ __forceinline__ BackwardScores(const FmhaParams& params, SequenceLengths len,
                                            int batch, int head)
      : f(params),
        seqlen_k(len.seqlen_k),
        diagonal(len.seqlen_k - len.seqlen_q),
        lowest(Window ? diagonal - params.window_left : 0),
        highest(Window ? diagonal + params.window_right : 0),
        slope_log2(Alibi ? __ldg(params.alibi_slopes + head) * kLog2e : 0.f),
        user_site(batch, head, len) {}

  // Whether some score of rows [row_lo, row_hi] x keys [key_lo, key_hi] is masked: only those
  // blocks pay for the per-score test.
  __device__ __forceinline__ bool any_masked(int row_lo, int row_hi, int key_lo,
                                             int key_hi) const {
    if constexpr (user::kMaskMod) return true;
    bool masked = (Causal && key_hi > row_lo + diagonal) || (kKeyEnd && key_hi >= seqlen_k);
    if (Window)
      masked = masked || key_hi > row_lo + diagonal + f.window_right ||
               key_lo < row_hi + diagonal - f.window_left;
    return masked;
  }
  __device__ __forceinline__ bool visible(int row, int key) const {
    if constexpr (user::kMaskMod)
      if (!user_site.mask_mod(f, row, key)) return false;
    if (kKeyEnd && key >= seqlen_k) return false;
    if (!Window) return !Causal || key <= row + diagonal;
    // key - row: one register plus constants over a thread's fragments.
    const int offset = key - row;
    return offset <= highest && (offset >= lowest || key < f.sink_tokens);
  }
  // The query rows that see `key`: visible(row, key) as one range, for kernels that test many
  // rows against one key (not with mask_mod, which is no range).
  struct Rows {
    int first, last;
    __device__ __forceinline__ bool hold(int row) const { return row >= first && row <= last; }
  };
  __device__ __forceinline__ Rows rows_seeing(int key) const {
    Rows rows{0, 1 << 30};  // every row (rows are below 2^30)
    if (Window) {
      rows.first = key - highest;
      if (key >= f.sink_tokens) rows.last = key - lowest;
    } else if (Causal) {
      rows.first = key - diagonal;
    }
    if (kKeyEnd && key >= seqlen_k) rows.last = -1;
    return rows;
  }
  // The forward's P of raw score x at (row, key), and what dS needs of it (for capped()).
  __device__ __forceinline__ float prob(float x, float lse_log2, int row, int key, bool masked,
                                        ScoreDerivative& d) const {
    float p;
    if constexpr (user::kScoreMod) {
      // The forward's natural-log score: softmax_scale · x or the cap's softcap · t, then ALiBi.
      float score;
      if constexpr (Softcap) {
        d.tanh = tanh_accurate(x * f.softcap_scale);
        score = f.softcap * d.tanh;
      } else {
        score = x * f.user_score_scale;
      }
      if constexpr (Alibi)
        score -= slope_log2 * kLn2F * fabsf(static_cast<float>(row + diagonal - key));
      d.mod = user_site.score_mod_grad(score, f, row, key);
      p = exp2_ftz(user_site.score_mod(score, f, row, key) * kLog2e - lse_log2);
    } else if constexpr (Softcap || Alibi) {
      float logit = x * f.scale_log2;
      if constexpr (Softcap) {
        d.tanh = tanh_accurate(x * f.softcap_scale);
        logit = f.softcap * d.tanh * f.scale_log2;
      }
      if constexpr (Alibi) logit -= slope_log2 * fabsf(static_cast<float>(row + diagonal - key));
      p = exp2_ftz(logit - lse_log2);
    } else {
      p = exp2_ftz(fmaf(x, f.scale_log2, -lse_log2));
    }
    if (kMasks && masked && !visible(row, key)) p = 0.f;
    return p;
  }
  // x times d score / d(scaled q·k): soft-capping's 1 - t², score_mod's derivative (x itself
  // without either).
  __device__ __forceinline__ static float capped(float x, const ScoreDerivative& d) {
    if constexpr (Softcap) x *= 1.f - d.tanh * d.tanh;
    if constexpr (user::kScoreMod) x *= d.mod;
    return x;
  }
  // dS = P ∘ (dP - delta), capped.
  __device__ __forceinline__ static float gradient(float p, float dp, float delta,
                                                   const ScoreDerivative& d) {
    return capped(p * (dp - delta), d);
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

// The warp-level pieces of FlashAttention-2 on mma.sync (m16n8k16, fp32 accumulation) that the
// mma and decode kernels share: S = Q·Kᵀ and O += P·V from padded shared tiles through ldmatrix,
// and the online softmax step between them, all in the accumulator layout of mma_sm80.cuh.
#pragma once

#include "common/epilogue.cuh"
#include "common/fast_math.cuh"
#include "common/mma_sm80.cuh"
#include "common/quad_reduce.cuh"
#include "common/types.cuh"

namespace flashjit {

// s = Q·Kᵀ for the warp's MT row tiles and the NT n8 key tiles of one K tile. q_at(mt, kk) and
// k_at(np, kk) give this lane's ldmatrix address for m-tile mt / key pair np (16 keys) at k16 step
// kk, so a tile may be padded or swizzled; Q fragments are re-read per k16 step (holding them all
// would cost HeadDim/2·MT registers).
template <typename T, int HeadDim, int MT, int NT, typename QAt, typename KAt>
__device__ __forceinline__ void gemm_qk_at(float (&s)[MT][NT][4], QAt q_at, KAt k_at) {
#pragma unroll
  for (int mt = 0; mt < MT; ++mt)
#pragma unroll
    for (int nt = 0; nt < NT; ++nt)
#pragma unroll
      for (int e = 0; e < 4; ++e) s[mt][nt][e] = 0.f;
#pragma unroll
  for (int kk = 0; kk < HeadDim / 16; ++kk) {
    unsigned a[MT][4];
#pragma unroll
    for (int mt = 0; mt < MT; ++mt) ldmatrix_x4(a[mt], q_at(mt, kk));
#pragma unroll
    for (int np = 0; np < NT / 2; ++np) {
      unsigned b[4];  // b[0], b[1]: keys 16np..16np+7; b[2], b[3]: keys 16np+8..16np+15
      ldmatrix_x4(b, k_at(np, kk));
#pragma unroll
      for (int mt = 0; mt < MT; ++mt) {
        mma_16x8x16<T>(s[mt][2 * np], a[mt], b[0], b[1]);
        mma_16x8x16<T>(s[mt][2 * np + 1], a[mt], b[2], b[3]);
      }
    }
  }
}

// gemm_qk_at over tiles with rows of Pitch elements: q_addr and k_addr are this lane's ldmatrix
// addresses for row/key 0, column 0.
template <typename T, int HeadDim, int MT, int NT, int Pitch>
__device__ __forceinline__ void gemm_qk(float (&s)[MT][NT][4], unsigned q_addr, unsigned k_addr) {
  gemm_qk_at<T, HeadDim, MT, NT>(
      s, [&](int mt, int kk) { return q_addr + (mt * 16 * Pitch + kk * 16) * 2; },
      [&](int np, int kk) { return k_addr + (np * 16 * Pitch + kk * 16) * 2; });
}

// o += P·V; v_at(kk, dp) is this lane's ldmatrix.trans address for keys 16kk.., dims 16dp...
template <typename T, int MT, int NT, int DT, typename VAt>
__device__ __forceinline__ void gemm_pv_at(float (&o)[MT][DT][4],
                                           const unsigned (&pr)[MT][NT / 2][4], VAt v_at) {
#pragma unroll
  for (int kk = 0; kk < NT / 2; ++kk) {
#pragma unroll
    for (int dp = 0; dp < DT / 2; ++dp) {
      unsigned b[4];  // b[0], b[1]: dims 16dp..16dp+7; b[2], b[3]: dims 16dp+8..16dp+15
      ldmatrix_x4_trans(b, v_at(kk, dp));
#pragma unroll
      for (int mt = 0; mt < MT; ++mt) {
        mma_16x8x16<T>(o[mt][2 * dp], pr[mt][kk], b[0], b[1]);
        mma_16x8x16<T>(o[mt][2 * dp + 1], pr[mt][kk], b[2], b[3]);
      }
    }
  }
}

// gemm_pv_at over a V tile with rows of Pitch elements; v_addr: this lane's address for key 0,
// dim 0.
template <typename T, int MT, int NT, int DT, int Pitch>
__device__ __forceinline__ void gemm_pv(float (&o)[MT][DT][4], const unsigned (&pr)[MT][NT / 2][4],
                                        unsigned v_addr) {
  gemm_pv_at<T, MT, NT, DT>(
      o, pr, [&](int kk, int dp) { return v_addr + (kk * 16 * Pitch + dp * 16) * 2; });
}

// The state before the first key: no output, max -inf, sum 0 for each of the lane's rows.
template <int MT, int DT>
__device__ __forceinline__ void start_online_softmax(float (&o)[MT][DT][4],
                                                     float (&row_max)[MT][2],
                                                     float (&row_sum)[MT][2]) {
#pragma unroll
  for (int mt = 0; mt < MT; ++mt) {
#pragma unroll
    for (int dt = 0; dt < DT; ++dt)
#pragma unroll
      for (int e = 0; e < 4; ++e) o[mt][dt][e] = 0.f;
#pragma unroll
    for (int h = 0; h < 2; ++h) {
      row_max[mt][h] = neg_inf();
      row_sum[mt][h] = 0.f;
    }
  }
}

// Online softmax step: folds the tile's scores s into the running max and sum of each of the
// lane's 2·MT rows (h = 0: row lane/4, h = 1: row lane/4 + 8), rescales o, and writes the
// probabilities, rounded to T, in A-operand order (k16 step kk = n8 tiles 2kk and 2kk+1). Sums
// stay per lane: the quad agrees on the max, so the partial sums add up at the end.
template <typename T, int MT, int NT, int DT>
__device__ __forceinline__ void online_softmax(float (&s)[MT][NT][4], float (&o)[MT][DT][4],
                                               unsigned (&probs)[MT][NT / 2][4],
                                               float (&row_max)[MT][2], float (&row_sum)[MT][2],
                                               float scale_log2) {
  float correction[MT][2];
  bool max_moved = false;
#pragma unroll
  for (int mt = 0; mt < MT; ++mt)
#pragma unroll
    for (int h = 0; h < 2; ++h) {
      float new_max = row_max[mt][h];
#pragma unroll
      for (int nt = 0; nt < NT; ++nt)
        new_max = fmaxf(new_max, fmaxf(s[mt][nt][2 * h], s[mt][nt][2 * h + 1]));
      new_max = quad_max(new_max);
      // 0 when the old max is -inf (nothing seen yet), exactly 1 when the max did not move.
      correction[mt][h] = exp2_ftz(row_max[mt][h] * scale_log2 - scaled_max(new_max, scale_log2));
      max_moved |= new_max != row_max[mt][h];
      row_max[mt][h] = new_max;
    }
  // The running max settles after a few tiles; from then on the whole warp skips multiplying
  // its accumulator by 1 (HeadDim/2·MT multiplies per lane per tile).
  if (__any_sync(0xffffffffu, max_moved)) {
#pragma unroll
    for (int mt = 0; mt < MT; ++mt)
#pragma unroll
      for (int dt = 0; dt < DT; ++dt)
#pragma unroll
        for (int e = 0; e < 4; ++e) o[mt][dt][e] *= correction[mt][e / 2];
  }
#pragma unroll
  for (int mt = 0; mt < MT; ++mt)
#pragma unroll
    for (int h = 0; h < 2; ++h) {
      const float offset = scaled_max(row_max[mt][h], scale_log2);
      float sum = 0.f;
#pragma unroll
      for (int nt = 0; nt < NT; ++nt) {
        const float p0 = exp2_ftz(fmaf(s[mt][nt][2 * h], scale_log2, -offset));
        const float p1 = exp2_ftz(fmaf(s[mt][nt][2 * h + 1], scale_log2, -offset));
        sum += p0 + p1;
        probs[mt][nt / 2][(nt % 2) * 2 + h] = pack2<T>(p0, p1);
      }
      row_sum[mt][h] = row_sum[mt][h] * correction[mt][h] + sum;
    }
}

}  // namespace flashjit

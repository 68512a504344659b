// ALiBi (Variant::alibi, FmhaParams::alibi_slopes): the scaled score of query row i and key j
// gets -slope[head] * |i + seqlen_k - seqlen_q - j|, after soft-capping and before the masks.
// Kernels hold raw scores (q·k, or the soft-capped score) that scale_log2 takes to log2 units, so
// a slope is converted once to those raw units; `diagonal` is i + seqlen_k - seqlen_q, the key at
// distance 0 from row i.
#pragma once

#include "common/params.cuh"

namespace flashjit {

// The slope of query head `head` in raw score units (natural-log units / softmax_scale).
__device__ __forceinline__ float alibi_raw_slope(const FmhaParams& p, int head) {
  return __ldg(p.alibi_slopes + head) * __fdividef(kLog2e, p.scale_log2);
}

// The m16n8 accumulator layout (mma.sync: s[mt][nt][2 * h + e] is row lane_row + 16 mt + 8 h, key
// lane_key + 8 nt + e); slope(mt, h) and diagonal(mt, h) give each row's (functions, so a kernel
// whose rows share one head keeps one slope, not a register per row).
template <int MT, int NT, typename Slope, typename Diagonal>
__device__ __forceinline__ void add_alibi(float (&s)[MT][NT][4], Slope slope, Diagonal diagonal,
                                          int lane_key) {
#pragma unroll
  for (int mt = 0; mt < MT; ++mt)
#pragma unroll
    for (int h = 0; h < 2; ++h) {
      const float distance0 = static_cast<float>(diagonal(mt, h) - lane_key);
      const float row_slope = slope(mt, h);
#pragma unroll
      for (int nt = 0; nt < NT; ++nt)
#pragma unroll
        for (int e = 0; e < 2; ++e)
          s[mt][nt][2 * h + e] =
              fmaf(-row_slope, fabsf(distance0 - static_cast<float>(8 * nt + e)),
                   s[mt][nt][2 * h + e]);
    }
}

}  // namespace flashjit

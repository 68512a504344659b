// Whole-tile wgmma GEMMs of one warpgroup over tiles as TMA's SWIZZLE_128B writes them: a tile of
// R rows and C columns (16-bit) is C / 64 column blocks of [R][64], 128 bytes a row, each block
// 1024-byte aligned. The forms the attention kernels use: D = A·Bᵀ with both operands in shared
// memory (rows of both are their K-index runs: S = Q·Kᵀ), D += A·B with A in registers and B's
// rows indexed by K (O += P·V), and D = A·B with both in shared memory, B's rows indexed by K
// (the backward's dQ = dS·K). Each call issues and commits one group, not waited on.
#pragma once

#include "common/sm90_wgmma.cuh"

namespace flashjit {

// d (+)= A·Bᵀ over Dims columns: A = 64 rows at `a_rows` of a tile of ARows rows (the warpgroup's
// slice: its start is the tile's plus 64 r · 128 bytes), B = a whole tile of N rows at `b_tile`.
// Accumulate = false overwrites d.
template <typename T, int Dims, int ARows, int N, bool Accumulate = false>
__device__ __forceinline__ void gemm_ss_tiles(float (&d)[N / 2], unsigned a_rows, unsigned b_tile) {
  static_assert(Dims % 64 == 0 && ARows % 64 == 0 && N % 16 == 0, "whole swizzled blocks");
  wgmma_fence();
  const unsigned long long a_desc = smem_desc_sw128(a_rows, 16, 1024);
  const unsigned long long b_desc = smem_desc_sw128(b_tile, 16, 1024);
#pragma unroll
  for (int kk = 0; kk < Dims / 16; ++kk) {
    // 16 columns = 32 bytes inside a 128-byte swizzle row; every 4 slices the next column block.
    const unsigned long long da = smem_desc_advance(a_desc, (kk / 4) * ARows * 128 + (kk % 4) * 32);
    const unsigned long long db = smem_desc_advance(b_desc, (kk / 4) * N * 128 + (kk % 4) * 32);
    if (kk == 0 && !Accumulate)
      wgmma_ss<T, N, false>(d, da, db);
    else
      wgmma_ss<T, N, true>(d, da, db);
  }
  wgmma_commit();
}

// d += A·B: A = 64 x K in registers, K / 16 fragments (gemm_fragments), B = a whole tile of K rows
// and N columns at `b_tile` (N-major: its rows are the K index, as V's keys in P·V).
template <typename T, int N, int K>
__device__ __forceinline__ void gemm_rs_tiles(float (&d)[N / 2], const unsigned (&a)[K / 16][4],
                                              unsigned b_tile) {
  static_assert(N % 64 == 0 && K % 16 == 0, "whole swizzled blocks, whole k16 slices");
  wgmma_fence();
  // Column blocks K rows apart; 8-row groups 1024 bytes apart, 16 rows a slice.
  const unsigned long long b_desc = smem_desc_sw128(b_tile, K * 128, 1024);
#pragma unroll
  for (int kk = 0; kk < K / 16; ++kk)
    wgmma_rs_tnsp_b<T, N>(d, a[kk], smem_desc_advance(b_desc, kk * 16 * 128));
  wgmma_commit();
}

// d = A·B with both operands in shared memory: A = 64 rows at `a_rows` of a tile of ARows rows
// and K columns (K-major, as gemm_ss_tiles's A), B = a tile of K rows and N columns at `b_tile`
// (N-major, as gemm_rs_tiles's B; N at most 64: one column block).
template <typename T, int N, int K, int ARows>
__device__ __forceinline__ void gemm_ss_tnsp_b_tiles(float (&d)[N / 2], unsigned a_rows,
                                                     unsigned b_tile) {
  static_assert(N % 16 == 0 && N <= 64 && K % 64 == 0 && ARows % 64 == 0, "whole swizzled blocks");
  wgmma_fence();
  const unsigned long long a_desc = smem_desc_sw128(a_rows, 16, 1024);
  const unsigned long long b_desc = smem_desc_sw128(b_tile, K * 128, 1024);
#pragma unroll
  for (int kk = 0; kk < K / 16; ++kk) {
    const unsigned long long da = smem_desc_advance(a_desc, (kk / 4) * ARows * 128 + (kk % 4) * 32);
    const unsigned long long db = smem_desc_advance(b_desc, kk * 16 * 128);
    if (kk == 0)
      wgmma_ss<T, N, false, true>(d, da, db);
    else
      wgmma_ss<T, N, true, true>(d, da, db);
  }
  wgmma_commit();
}

// A 64 x N accumulator rounded to T as the A fragments of N / 16 k16 slices: the accumulator
// layout of 16 columns is the A layout of one slice (rows r and r + 8, columns c and c + 8), so
// this is only packing.
template <typename T, int N>
__device__ __forceinline__ void gemm_fragments(unsigned (&a)[N / 16][4], const float (&x)[N / 2]) {
#pragma unroll
  for (int kk = 0; kk < N / 16; ++kk)
#pragma unroll
    for (int r = 0; r < 4; ++r) a[kk][r] = pack2<T>(x[8 * kk + 2 * r], x[8 * kk + 2 * r + 1]);
}

}  // namespace flashjit

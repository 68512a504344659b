// stmatrix (sm_90): a warp stores 8 x 8 matrices of 16-bit elements from mma/wgmma accumulator
// fragments into shared memory, one 16-byte row per address, with no shuffles.
#pragma once

namespace flashjit {

// Stores four 8 x 8 matrices. Lane l holds word l % 4 (two adjacent columns) of row l / 4 of each
// matrix m in w[m], the accumulator layout; lane 8 m + r gives the 16-byte-aligned shared-memory
// address of row r of matrix m. Every lane of the warp must call it.
__device__ __forceinline__ void stmatrix_x4(unsigned smem_addr, const unsigned (&w)[4]) {
  asm volatile("stmatrix.sync.aligned.m8n8.x4.shared.b16 [%0], {%1, %2, %3, %4};" ::"r"(smem_addr),
               "r"(w[0]), "r"(w[1]), "r"(w[2]), "r"(w[3])
               : "memory");
}

// The same four matrices stored transposed: the address of lane 8 m + r receives column r of
// matrix m (its 8 rows, 16 bytes), so an accumulator whose rows are keys lands with queries as
// rows.
__device__ __forceinline__ void stmatrix_x4_trans(unsigned smem_addr, const unsigned (&w)[4]) {
  asm volatile(
      "stmatrix.sync.aligned.m8n8.x4.trans.shared.b16 [%0], {%1, %2, %3, %4};" ::"r"(smem_addr),
      "r"(w[0]), "r"(w[1]), "r"(w[2]), "r"(w[3])
      : "memory");
}

}  // namespace flashjit

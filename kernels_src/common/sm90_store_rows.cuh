// Writes a warpgroup's 64 x N fp32 wgmma accumulator (layout: common/sm90_wgmma.cuh) to global
// memory as rows of 16-bit values, 16 bytes per store.
#pragma once

#include "common/global_store.cuh"
#include "common/quad_transpose.cuh"
#include "common/types.cuh"

namespace flashjit {

// Row first_row + i of the tile goes to out + (first_row + i) * row_stride, times `scale`, if
// first_row + i < rows. A quad holds one 2-column word of each 8-column block of a row; a
// transpose over each 4 blocks gives every lane one whole block (16 bytes: rows must be 16-byte
// aligned, which validation guarantees for every tensor). Every lane of the warpgroup must call it.
template <typename T, int N>
__device__ __forceinline__ void store_accumulator_rows(T* out, long long row_stride, int first_row,
                                                       int rows, const float (&acc)[N / 2],
                                                       float scale) {
  static_assert(N % 32 == 0, "whole groups of four 8-column blocks");
  const int lane = threadIdx.x % 32;
  const int thread_row = first_row + 16 * ((threadIdx.x / 32) % 4) + lane / 4;
#pragma unroll
  for (int i = 0; i < 2; ++i) {
    const int row = thread_row + 8 * i;
    const bool in_range = row < rows;  // only the store: the shuffles need the whole warp
    T* out_row = out + static_cast<long long>(row) * row_stride + 8 * (lane % 4);
#pragma unroll
    for (int g = 0; g < N / 32; ++g) {
      unsigned w[4];
#pragma unroll
      for (int k = 0; k < 4; ++k) {
        const int e = 4 * (4 * g + k) + 2 * i;  // block 4g + k, row + 8i
        w[k] = pack2<T>(acc[e] * scale, acc[e + 1] * scale);
      }
      quad_transpose(w);  // lane q: block 4g + q whole
      store_global_16(out_row + 32 * g, w, in_range);
    }
  }
}

}  // namespace flashjit

// Copies [Rows, HeadDim] tiles of a [seqlen, HeadDim] matrix (rows strided in global memory) into
// padded shared tiles with cp.async (sm_80 and later), 16 bytes per copy. Rows past the end are
// zero-filled, so padding keys score 0 before masking and padding values never put NaN or Inf
// into P·V.
#pragma once

#include "common/mma_sm80.cuh"

namespace flashjit {

// The largest power of two that is at most `limit` and divides `rows`.
constexpr int pow2_row_step(int limit, int rows) {
  int step = 1;
  while (step * 2 <= limit && rows % (step * 2) == 0) step *= 2;
  return step;
}

// Each thread owns one 16-byte column of a tile and every kRowStep-th row of it. Only the
// thread's offset into the matrix is kept; tile addresses are recomputed per copy (one 64-bit
// multiply-add), which holds fewer registers across the attention loop than running pointers.
template <typename T, int HeadDim, int Rows, int SmemPitch, int Threads>
struct TileStream {
  static constexpr int kVecsPerRow = HeadDim / 8;
  static constexpr int kRowStep = pow2_row_step(Threads / kVecsPerRow, Rows);  // rows per pass
  static constexpr int kActive = kRowStep * kVecsPerRow;                       // threads that copy

  const T* src;  // this thread's vector in row 0 of the matrix
  int row;       // this thread's first row within a tile

  __device__ __forceinline__ TileStream(const T* gmem, long long row_stride) {
    row = static_cast<int>(threadIdx.x) / kVecsPerRow;
    src = gmem + row * row_stride + static_cast<int>(threadIdx.x) % kVecsPerRow * 8;
  }

  // Issues (does not wait for) the copies of rows [row0, row0 + Rows) into the shared tile at
  // `smem_tile`; rows at or past `row_end` read nothing and are zero-filled. Every thread of the
  // CTA must call it.
  __device__ __forceinline__ void copy(unsigned smem_tile, int row0, int row_end,
                                       long long row_stride) const {
    if (kActive != Threads && static_cast<int>(threadIdx.x) >= kActive) return;
    const T* from = src + row0 * row_stride;
    const unsigned dst = smem_tile + (row * SmemPitch + static_cast<int>(threadIdx.x) %
                                      kVecsPerRow * 8) * static_cast<unsigned>(sizeof(T));
    const int rows_left = row_end - row0 - row;
#pragma unroll
    for (int i = 0; i < Rows / kRowStep; ++i) {
      cp_async_16(dst + i * kRowStep * SmemPitch * static_cast<unsigned>(sizeof(T)), from,
                  i * kRowStep < rows_left);
      from += kRowStep * row_stride;
    }
  }
};

}  // namespace flashjit

// Copies [Rows, HeadDim] tiles of a [seqlen, HeadDim] matrix (rows strided in global memory, or
// rows of a paged cache's pages) into padded shared tiles with cp.async (sm_80 and later), 16
// bytes per copy. Rows past the end are zero-filled, so padding keys score 0 before masking and
// padding values never put NaN or Inf into P·V.
#pragma once

#include "common/mma_sm80.cuh"
#include "common/paged_keys.cuh"
#include "common/params.cuh"

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

// The same tiles from a paged KV cache (FmhaParams::page_table; common/paged_keys.cuh): row r of
// sequence `batch` is row r % page_size of its page. Each copy looks its row's page up (rows past
// the end read neither the table nor the cache); the page table's row of a sequence is a few
// hundred bytes that every CTA of the sequence reads, so the lookups hit L1. The table's pointer,
// strides and page size are read from the params at each copy, not held across the loop.
template <typename T, int HeadDim, int Rows, int SmemPitch, int Threads>
struct PagedTileStream {
  using Dense = TileStream<T, HeadDim, Rows, SmemPitch, Threads>;

  const T* src;  // this thread's vector in row 0 of page 0, at the head's offset
  int row;       // this thread's first row within a tile

  __device__ __forceinline__ explicit PagedTileStream(const T* head_base) {
    row = static_cast<int>(threadIdx.x) / Dense::kVecsPerRow;
    src = head_base + static_cast<int>(threadIdx.x) % Dense::kVecsPerRow * 8;
  }

  // Issues the copies of rows [row0, row0 + Rows) of sequence `batch`, pages `page_stride`
  // elements apart and rows `row_stride`; as TileStream::copy otherwise.
  __device__ __forceinline__ void copy(const FmhaParams& p, int batch, unsigned smem_tile,
                                       int row0, int row_end, long long page_stride,
                                       long long row_stride) const {
    if (Dense::kActive != Threads && static_cast<int>(threadIdx.x) >= Dense::kActive) return;
    const int page_shift = page_shift_of(p);
    const unsigned dst = smem_tile + (row * SmemPitch + static_cast<int>(threadIdx.x) %
                                      Dense::kVecsPerRow * 8) * static_cast<unsigned>(sizeof(T));
    // Four rows' lookups in flight at a time: unrolled whole, the d64 128-key kernels spilled
    // (16-76 B at 255 registers); one at a time, each waits for the last.
#pragma unroll 4
    for (int i = 0; i < Rows / Dense::kRowStep; ++i) {
      const int key = row0 + row + i * Dense::kRowStep;
      const bool valid = key < row_end;
      long long offset = 0;
      if (valid) {
        const KvRow at = locate_key<true>(p, batch, key, page_shift, 0, 0);
        offset = at.block * page_stride + at.row * row_stride;
      }
      cp_async_16(dst + i * Dense::kRowStep * SmemPitch * static_cast<unsigned>(sizeof(T)),
                  src + offset, valid);
    }
  }
};

}  // namespace flashjit

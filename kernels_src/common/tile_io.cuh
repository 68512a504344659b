// Global <-> shared copies of [rows, HeadDim] tiles in 16-byte vectors, zero-filling rows past
// the end so that padding can never inject NaN or Inf into a dot product.
#pragma once

namespace flashjit {

template <typename T, int HeadDim, int Rows, int Threads>
__device__ __forceinline__ void load_rows_zero_fill(T* smem_tile, int smem_pitch, const T* gmem,
                                                    long long gmem_row_stride, int row0,
                                                    int row_end) {
  constexpr int kVecsPerRow = HeadDim / 8;
  for (int i = threadIdx.x; i < Rows * kVecsPerRow; i += Threads) {
    const int r = i / kVecsPerRow;
    const int c = (i % kVecsPerRow) * 8;
    uint4 value = make_uint4(0, 0, 0, 0);
    if (row0 + r < row_end)
      value = *reinterpret_cast<const uint4*>(gmem + (row0 + r) * gmem_row_stride + c);
    *reinterpret_cast<uint4*>(smem_tile + r * smem_pitch + c) = value;
  }
}

}  // namespace flashjit

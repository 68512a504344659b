// Max and sum over the 4 consecutive lanes (a quad) that share one row: the 4 threads per query
// row of the simt kernel, and the quad holding one row of an mma.sync accumulator.
#pragma once

namespace flashjit {

__device__ __forceinline__ float quad_max(float x) {
  x = fmaxf(x, __shfl_xor_sync(0xffffffffu, x, 1));
  return fmaxf(x, __shfl_xor_sync(0xffffffffu, x, 2));
}

__device__ __forceinline__ float quad_sum(float x) {
  x += __shfl_xor_sync(0xffffffffu, x, 1);
  return x + __shfl_xor_sync(0xffffffffu, x, 2);
}

}  // namespace flashjit

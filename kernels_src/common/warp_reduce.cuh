// Max and sum over all 32 lanes of a warp (butterfly: every lane gets the result).
#pragma once

namespace flashjit {

__device__ __forceinline__ float warp_max(float x) {
#pragma unroll
  for (int bit = 16; bit > 0; bit /= 2) x = fmaxf(x, __shfl_xor_sync(0xffffffffu, x, bit));
  return x;
}

__device__ __forceinline__ float warp_sum(float x) {
#pragma unroll
  for (int bit = 16; bit > 0; bit /= 2) x += __shfl_xor_sync(0xffffffffu, x, bit);
  return x;
}

}  // namespace flashjit

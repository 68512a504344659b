// Max and sum over the lanes of a warp or of groups of them (butterfly: every lane gets the
// result).
#pragma once

namespace flashjit {

__device__ __forceinline__ float warp_max(float x) {
#pragma unroll
  for (int bit = 16; bit > 0; bit /= 2) x = fmaxf(x, __shfl_xor_sync(0xffffffffu, x, bit));
  return x;
}

// Sum over each aligned group of Lanes lanes (a power of two up to 32); all 32 lanes take part.
template <int Lanes>
__device__ __forceinline__ float lane_group_sum(float x) {
  static_assert(Lanes >= 1 && Lanes <= 32 && (Lanes & (Lanes - 1)) == 0, "a power of two <= 32");
#pragma unroll
  for (int bit = Lanes / 2; bit > 0; bit /= 2) x += __shfl_xor_sync(0xffffffffu, x, bit);
  return x;
}

__device__ __forceinline__ float warp_sum(float x) { return lane_group_sum<32>(x); }

}  // namespace flashjit

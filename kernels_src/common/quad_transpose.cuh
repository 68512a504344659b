// 4 x 4 transpose of 32-bit words across the 4 lanes of a quad, so that an accumulator row spread
// over a quad (one word per lane per 8-column block) becomes one contiguous 16-byte block per lane.
#pragma once

namespace flashjit {

// Lane t's word k becomes lane k's word t. Each butterfly stage (partner t ^ 2, then t ^ 1) swaps
// one bit between the lane and word indices: a lane keeps the two words whose bit matches its own
// and trades the other two, one shuffle each, so 4 shuffles in all. Every lane of the warp must
// call it (the shuffles are full-warp); lanes are numbered from threadIdx.x of a 1-D block.
__device__ __forceinline__ void quad_transpose(unsigned (&w)[4]) {
  const unsigned lane = threadIdx.x % 4;
#pragma unroll
  for (int bit = 2; bit >= 1; bit /= 2) {
    const bool upper = lane & bit;
#pragma unroll
    for (int k = 0; k < 4; ++k) {
      if (k & bit) continue;
      const unsigned got = __shfl_xor_sync(0xffffffffu, upper ? w[k] : w[k | bit], bit);
      if (upper) w[k] = got;
      else w[k | bit] = got;
    }
  }
}

}  // namespace flashjit

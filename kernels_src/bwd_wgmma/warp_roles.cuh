// What the two Hopper backward kernels (bwd_wgmma/kernel.cu, dq_kernel.cu) share: where a
// consumer thread's accumulator elements sit, a consumer warp's release of a ring stage, and the
// step from the kernel's entry into its producer or consumer role.
#pragma once

#include "bwd_wgmma/shape.cuh"
#include "common/sm90_mbarrier.cuh"
#include "common/sm90_warpgroup.cuh"

namespace flashjit {

// Accumulator element e of a thread sits at row 16 warp + lane / 4 + 8 ((e / 2) % 2) and column
// 8 (e / 4) + 2 (lane % 4) + e % 2 of its warpgroup's 64 x N tile (common/sm90_wgmma.cuh).
struct FragmentPosition {
  int row;  // the first of the thread's two rows (the other is row + 8)
  int col;  // the first of its two adjacent columns in each 8-column block

  __device__ __forceinline__ FragmentPosition()
      : row(16 * ((threadIdx.x / 32) % 4) + threadIdx.x % 32 / 4), col(2 * (threadIdx.x % 4)) {}
};

// One arrival per consumer warp tells the producer a stage may be overwritten (empty barriers
// count the consumer warps).
__device__ __forceinline__ void release_stage(unsigned long long* empty) {
  if (threadIdx.x % 32 == 0) mbarrier_arrive(empty);
}

// The 128B swizzle repeats every 1024 bytes and wgmma assumes its atoms start on that grid: the
// tiles start at the first 1024-byte boundary of dynamic shared memory (the shapes reserve the
// slack).
__device__ __forceinline__ unsigned char* aligned_tiles(unsigned char* smem_raw) {
  return smem_raw + ((1024 - smem_u32(smem_raw) % 1024) % 1024);
}

// This thread's warpgroup (0: the producer), read through a shuffle so the compiler knows it is
// warp-uniform; the producer gives its registers up and the consumers take them.
__device__ __forceinline__ int enter_role() {
  const int warpgroup = __shfl_sync(0xffffffffu, threadIdx.x / kWarpgroupThreads, 0);
  if (warpgroup == 0)
    warpgroup_lower_registers<BwdWgmmaLimits::kProducerRegisters>();
  else
    warpgroup_raise_registers<BwdWgmmaLimits::kConsumerRegisters>();
  return warpgroup;
}

}  // namespace flashjit

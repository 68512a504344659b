// Warpgroup coordination (sm_90a): register rebalancing between producer and consumer
// warpgroups, and named barriers for turn-taking between warpgroups.
#pragma once

#include "common/warpgroup_size.cuh"

namespace flashjit {

// Raises this warpgroup's register limit to Regs per thread (consumers: accumulators live here).
// Takes effect only with a register cap at entry: __launch_bounds__(threads, 1).
template <int Regs>
__device__ __forceinline__ void warpgroup_raise_registers() {
  asm volatile("setmaxnreg.inc.sync.aligned.u32 %0;" ::"n"(Regs));
}

// Lowers this warpgroup's register limit to Regs per thread, returning the rest to the pool.
template <int Regs>
__device__ __forceinline__ void warpgroup_lower_registers() {
  asm volatile("setmaxnreg.dec.sync.aligned.u32 %0;" ::"n"(Regs));
}

// Waits at hardware barrier `id` until `threads` threads have arrived or synced there.
__device__ __forceinline__ void named_barrier_sync(int id, int threads) {
  asm volatile("bar.sync %0, %1;" ::"r"(id), "r"(threads) : "memory");
}

// Counts this warp's threads at barrier `id` without waiting (signals a waiting warpgroup).
__device__ __forceinline__ void named_barrier_arrive(int id, int threads) {
  asm volatile("bar.arrive %0, %1;" ::"r"(id), "r"(threads) : "memory");
}

}  // namespace flashjit

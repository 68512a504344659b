// cp.async (sm_80 and later): 16-byte copies from global into shared memory that bypass the
// registers, completed per thread through commit groups or an mbarrier.
#pragma once

namespace flashjit {

// 16 bytes global -> shared without a register round trip (L1 bypassed); zero-fills the 16
// bytes instead when !valid, reading nothing.
__device__ __forceinline__ void cp_async_16(unsigned dst, const void* src, bool valid) {
  asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;\n" ::"r"(dst), "l"(src),
               "r"(valid ? 16 : 0));
}
// Closes the calling thread's current group of cp.async copies.
__device__ __forceinline__ void cp_async_commit() { asm volatile("cp.async.commit_group;\n" ::); }
// Waits until at most `Pending` of the calling thread's newest groups are still in flight.
template <int Pending>
__device__ __forceinline__ void cp_async_wait() {
  asm volatile("cp.async.wait_group %0;\n" ::"n"(Pending) : "memory");
}

// Arrives on the mbarrier at shared address `bar` once all of the calling thread's earlier
// cp.async copies have landed. noinc: the arrival is one of the barrier's initial count (each
// copying thread counts once), not an extra one.
__device__ __forceinline__ void cp_async_arrive_noinc(unsigned bar) {
  asm volatile("cp.async.mbarrier.arrive.noinc.shared::cta.b64 [%0];\n" ::"r"(bar) : "memory");
}

}  // namespace flashjit

// TMA (the bulk tensor copy engine, sm_90): tensor maps built on the host with
// cuTensorMapEncodeTiled arrive as __grid_constant__ kernel parameters; one thread issues a copy of
// a whole box. Loads into shared memory complete on an mbarrier; stores to global memory complete
// in the issuing thread's bulk async-groups, which that thread commits and waits on.
#pragma once

#include "common/sm90_mbarrier.cuh"

namespace flashjit {

// Opaque bytes of a CUtensorMap (cuda.h is not available inside kernels); same size and alignment.
struct alignas(64) TmaDescriptor {
  unsigned long long words[16];
};

// Pulls the descriptor into the TMA unit's cache ahead of the first copy.
__device__ __forceinline__ void tma_prefetch_descriptor(const TmaDescriptor* map) {
  asm volatile("prefetch.tensormap [%0];" ::"l"(reinterpret_cast<unsigned long long>(map))
               : "memory");
}

// Copies the box at coordinates (c0 innermost .. c3) of a rank-4 map into shared memory at `dst`;
// out-of-range elements are written as zeros; completion adds the box's bytes to `bar`.
__device__ __forceinline__ void tma_load_4d(void* dst, const TmaDescriptor* map,
                                            unsigned long long* bar, int c0, int c1, int c2,
                                            int c3) {
  asm volatile(
      "cp.async.bulk.tensor.4d.shared::cluster.global.tile.mbarrier::complete_tx::bytes"
      " [%0], [%1, {%2, %3, %4, %5}], [%6];" ::"r"(smem_u32(dst)),
      "l"(reinterpret_cast<unsigned long long>(map)), "r"(c0), "r"(c1), "r"(c2), "r"(c3),
      "r"(smem_u32(bar))
      : "memory");
}

// Adds the fp32 box in shared memory at `src` into global memory at coordinates (c0 innermost, c1)
// of a rank-2 map, element by element and atomically, in this thread's bulk async-group;
// out-of-range elements are skipped.
__device__ __forceinline__ void tma_reduce_add_2d(const TmaDescriptor* map, unsigned src, int c0,
                                                  int c1) {
  asm volatile(
      "cp.reduce.async.bulk.tensor.2d.global.shared::cta.add.tile.bulk_group [%0, {%1, %2}], [%3];" ::"l"(
          reinterpret_cast<unsigned long long>(map)),
      "r"(c0), "r"(c1), "r"(src)
      : "memory");
}

// Copies `bytes` (a multiple of 16; both addresses 16-byte aligned) of contiguous global memory to
// shared memory at `dst`, no tensor map; completion adds the bytes to `bar` like a box's.
__device__ __forceinline__ void bulk_load(void* dst, const void* src, unsigned bytes,
                                          unsigned long long* bar) {
  asm volatile(
      "cp.async.bulk.shared::cluster.global.mbarrier::complete_tx::bytes [%0], [%1], %2, [%3];" ::"r"(
          smem_u32(dst)),
      "l"(reinterpret_cast<unsigned long long>(src)), "r"(bytes), "r"(smem_u32(bar))
      : "memory");
}

// Copies a box from shared memory (at shared-window address `src`) to coordinates (c0 innermost
// .. c3) of a rank-4 map. Elements of the box outside the tensor's dimensions are not written: the
// map bounds every dimension. The copy joins this thread's open bulk async-group.
__device__ __forceinline__ void tma_store_4d(const TmaDescriptor* map, unsigned src, int c0,
                                             int c1, int c2, int c3) {
  asm volatile(
      "cp.async.bulk.tensor.4d.global.shared::cta.tile.bulk_group"
      " [%0, {%2, %3, %4, %5}], [%1];" ::"l"(reinterpret_cast<unsigned long long>(map)),
      "r"(src), "r"(c0), "r"(c1), "r"(c2), "r"(c3)
      : "memory");
}

// Adds `bytes` (a multiple of 16) of fp32 from shared memory into global memory, element by
// element, as one bulk async copy (the global side is reduced atomically by the memory system).
__device__ __forceinline__ void bulk_reduce_add_f32(float* dst, unsigned src, unsigned bytes) {
  asm volatile("cp.reduce.async.bulk.global.shared::cta.bulk_group.add.f32 [%0], [%1], %2;"
               ::"l"(dst), "r"(src), "r"(bytes)
               : "memory");
}

// Closes this thread's bulk copies issued since its last commit into one bulk async-group.
__device__ __forceinline__ void bulk_commit_group() {
  asm volatile("cp.async.bulk.commit_group;" ::: "memory");
}

// Waits until at most Pending of this thread's bulk groups are still reading their shared-memory
// source: the source may be overwritten then, though the global writes may still be in flight.
template <int Pending>
__device__ __forceinline__ void bulk_wait_group_read() {
  asm volatile("cp.async.bulk.wait_group.read %0;" ::"n"(Pending) : "memory");
}

// Waits until at most Pending of this thread's bulk groups have not completed (writes included).
template <int Pending>
__device__ __forceinline__ void bulk_wait_group() {
  asm volatile("cp.async.bulk.wait_group %0;" ::"n"(Pending) : "memory");
}

// Makes this thread's ordinary writes to shared memory visible to the async proxy (TMA), which
// reads shared memory through another path: each writer fences before the barrier that precedes
// the TMA store.
__device__ __forceinline__ void fence_proxy_async_shared() {
  asm volatile("fence.proxy.async.shared::cta;" ::: "memory");
}

}  // namespace flashjit

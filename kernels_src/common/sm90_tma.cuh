// TMA (the bulk tensor copy engine, sm_90): tensor maps built on the host with
// cuTensorMapEncodeTiled arrive as __grid_constant__ kernel parameters; one thread issues a copy of
// a whole box into shared memory and the bytes complete on an mbarrier.
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

}  // namespace flashjit

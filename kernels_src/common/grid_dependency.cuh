// Programmatic dependent launch (sm_90 on): the host launches every kernel with programmatic
// stream serialization (LaunchPlan::overlaps_previous), so its CTAs may be scheduled while the
// stream's previous kernel finishes, hiding the launch gap between kernels of one stream.
#pragma once

namespace flashjit {

// Every kernel's first statement. It waits until the stream's previous grid has completed and its
// writes are visible (a no-op for an ordinary launch), then lets the next grid be scheduled: its
// CTAs take SMs as this grid's leave and wait there in this same call. Waiting first in every CTA
// keeps "the previous grid has completed" true along the whole stream, since no grid completes
// before the one it followed: a workspace the next call reuses is safe.
__device__ __forceinline__ void begin_after_previous_grid() {
#if __CUDA_ARCH__ >= 900
  asm volatile("griddepcontrol.wait;" ::: "memory");
  asm volatile("griddepcontrol.launch_dependents;" ::: "memory");
#endif
}

}  // namespace flashjit

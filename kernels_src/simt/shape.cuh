// Geometry of the simt kernel (simt/kernel.cu): threads and shared-memory layout. Plain C++ read by
// NVRTC (the kernel) and by g++ (src/families/simt), so the launch cannot disagree with the kernel.
#pragma once

#include "common/host_device.cuh"

namespace flashjit {

struct SimtShape {
  int head_dim, tile_m, tile_n;

  static constexpr int kThreadsPerRow = 4;  // each thread scores tile_n / 4 keys of its row
  static constexpr int kElementBytes = 2;   // bf16 and fp16

  FLASHJIT_HOST_DEVICE constexpr int threads() const { return tile_m * kThreadsPerRow; }
  // Elements per shared row of Q, K or V: 16 bytes of padding stagger rows across banks.
  FLASHJIT_HOST_DEVICE constexpr int row_pitch() const { return head_dim + 8; }
  FLASHJIT_HOST_DEVICE constexpr int prob_pitch() const { return tile_n + 4; }  // floats
  // Shared memory: the Q tile, one key tile (K, then V of the same keys), the probabilities.
  FLASHJIT_HOST_DEVICE constexpr int q_elements() const { return tile_m * row_pitch(); }
  FLASHJIT_HOST_DEVICE constexpr int kv_elements() const { return tile_n * row_pitch(); }
  FLASHJIT_HOST_DEVICE constexpr int shared_bytes() const {
    return (q_elements() + kv_elements()) * kElementBytes + tile_m * prob_pitch() * 4;
  }
};

}  // namespace flashjit

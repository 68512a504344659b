// Geometry of the mma kernel (mma/kernel.cu): threads and shared-memory layout. Plain C++ read by
// NVRTC (the kernel) and by g++ (src/families/mma), so the launch cannot disagree with the kernel.
#pragma once

#include "common/host_device.cuh"

namespace flashjit {

struct MmaShape {
  int head_dim, tile_m, tile_n, stages;

  static constexpr int kWarps = 4;  // each owns tile_m / 4 query rows
  static constexpr int kThreads = kWarps * 32;
  static constexpr int kElementBytes = 2;  // bf16 and fp16

  // Elements per shared row: 16 bytes of padding put the 8 rows of one ldmatrix phase in 8
  // distinct groups of 4 banks for every head dim.
  FLASHJIT_HOST_DEVICE constexpr int pitch() const { return head_dim + 8; }
  FLASHJIT_HOST_DEVICE constexpr int kv_tile_elements() const { return tile_n * pitch(); }
  // Shared memory: the Q tile (later the output's staging area), `stages` K tiles, `stages` V.
  FLASHJIT_HOST_DEVICE constexpr int shared_bytes() const {
    return (tile_m * pitch() + 2 * stages * kv_tile_elements()) * kElementBytes;
  }
};

}  // namespace flashjit

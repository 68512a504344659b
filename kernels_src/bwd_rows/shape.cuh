// Geometry of the backward pass's row kernels (bwd_rows/kernel.cu): one warp per query row, and
// the rows each (batch, head) keeps in the workspace. Read by NVRTC and g++ (src/families/bwd_rows).
#pragma once

#include "common/host_device.cuh"

namespace flashjit {

struct BwdRowsShape {
  static constexpr int kWarps = 8;  // rows per CTA
  static constexpr int kThreads = kWarps * 32;
  // The workspace's rows per (batch, head) are seqlen_q rounded up to this, a multiple of every
  // backward tile_m, so a tile's row terms are whole 16-byte vectors that need no bounds check.
  static constexpr int kRowQuantum = 128;
  FLASHJIT_HOST_DEVICE static constexpr int padded_rows(int seqlen_q) {
    return (seqlen_q + kRowQuantum - 1) / kRowQuantum * kRowQuantum;
  }
};

}  // namespace flashjit

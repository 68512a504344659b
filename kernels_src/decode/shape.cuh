// Geometry of the decode kernel (decode/kernel.cu): threads and shared-memory layout. Plain C++
// read by NVRTC (the kernel) and by g++ (src/families/decode), so the launch cannot disagree with
// the kernel.
#pragma once

#include "common/host_device.cuh"

namespace flashjit {

struct DecodeShape {
  int head_dim, tile_m, tile_n, stages;
  // K/V tiles loaded by TMA (Hopper) into 128-byte-swizzled [head_dim / 64][tile_n][64] chunks;
  // else by cp.async into rows padded by 16 bytes.
  bool tma = false;

  // Each K/V tile is divided among kKeyWarps warps (tile_n / 4 keys each), which hold every row of
  // their row group: at most kMaxGroupRows rows, whose output takes 128 registers a thread at
  // d128. A tile of 64 rows is two row groups, 8 warps, reading each K/V tile once for both
  // (where two CTAs of 32 rows read it twice).
  static constexpr int kKeyWarps = 4;
  static constexpr int kMaxGroupRows = 32;
  static constexpr int kElementBytes = 2;  // bf16 and fp16
  static constexpr int kMaxRowsPerKvHead = 64;  // larger problems are prefill's
  static constexpr int kBoxWidth = 64;          // TMA: elements per swizzled chunk row (128 B)
  static constexpr int kSwizzleAlign = 1024;    // TMA: the swizzle pattern's period

  // Elements per shared Q row (and cp.async K/V row): 16 bytes of padding put the 8 rows of one
  // ldmatrix phase in 8 distinct bank groups.
  FLASHJIT_HOST_DEVICE constexpr int pitch() const { return head_dim + 8; }
  FLASHJIT_HOST_DEVICE constexpr int row_groups() const {
    return tile_m > kMaxGroupRows ? tile_m / kMaxGroupRows : 1;
  }
  FLASHJIT_HOST_DEVICE constexpr int group_rows() const { return tile_m / row_groups(); }
  FLASHJIT_HOST_DEVICE constexpr int threads() const { return row_groups() * kKeyWarps * 32; }
  FLASHJIT_HOST_DEVICE constexpr int keys_per_warp() const { return tile_n / kKeyWarps; }
  FLASHJIT_HOST_DEVICE constexpr int q_bytes() const { return tile_m * pitch() * kElementBytes; }
  // One K (or V) tile, and one pipeline stage: a K tile then a V tile.
  FLASHJIT_HOST_DEVICE constexpr int tile_elements() const {
    return tile_n * (tma ? head_dim : pitch());
  }
  FLASHJIT_HOST_DEVICE constexpr int stage_elements() const { return 2 * tile_elements(); }
  FLASHJIT_HOST_DEVICE constexpr int ring_bytes() const {
    return stages * stage_elements() * kElementBytes;
  }
  // After the key loop the ring holds one row group's partial results at a time for their merge:
  // the key warps' fp32 outputs (rows padded by 8 floats) and each row's max and sum.
  FLASHJIT_HOST_DEVICE constexpr int merge_pitch() const { return head_dim + 8; }
  FLASHJIT_HOST_DEVICE constexpr int merge_bytes() const {
    return kKeyWarps * group_rows() * (merge_pitch() + 2) * 4;
  }
  // TMA: one mbarrier per stage ahead of Q (rounded up to keep Q's cp.async rows 16-byte
  // aligned), and room to align the ring to the swizzle period.
  FLASHJIT_HOST_DEVICE constexpr int barrier_bytes() const {
    return tma ? (stages * 8 + 15) / 16 * 16 : 0;
  }
  FLASHJIT_HOST_DEVICE constexpr int shared_bytes() const {
    return barrier_bytes() + q_bytes() + (tma ? kSwizzleAlign - 16 : 0) +
           (ring_bytes() > merge_bytes() ? ring_bytes() : merge_bytes());
  }
};

}  // namespace flashjit

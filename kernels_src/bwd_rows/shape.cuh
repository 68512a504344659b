// Geometry of the backward pass's row kernels (bwd_rows/kernel.cu). The rows each sequence and
// head keeps in the workspace: common/bwd_workspace.cuh. Read by NVRTC and g++
// (src/families/bwd_rows), so the launches cannot disagree with the kernels.
#pragma once

#include "common/bwd_workspace.cuh"
#include "common/host_device.cuh"

namespace flashjit {

struct BwdRowsShape {
  static constexpr int kThreads = 256;
  static constexpr int kWarps = kThreads / 32;  // the variants' tile_m (m8n1s1)
  static constexpr int kVectorElements = 8;     // 16 bytes of bf16 / fp16

  // bwd_prep: a group of lanes per row, each with 16 bytes of O and of dO (two loads in flight a
  // lane: one warp per row kept too few bytes in flight at head dim 64), head_dim / 8 rounded up
  // to a power of two so the group sums by butterfly. Rows per CTA divide the workspace's row
  // quantum, so a CTA's rows are all inside a (sequence, head)'s padded rows or all past them.
  FLASHJIT_HOST_DEVICE static constexpr int prep_lanes(int head_dim) {
    int lanes = 1;
    while (lanes * kVectorElements < head_dim) lanes *= 2;
    return lanes;
  }
  FLASHJIT_HOST_DEVICE static constexpr int prep_rows(int head_dim) {
    return kThreads / prep_lanes(head_dim);
  }

  // bwd_convert: a CTA per 64 rows x 64 columns of the accumulator, 16 floats a thread read with
  // 16-byte loads and written as two 16-byte stores of dq (the fused backward's blocks,
  // BwdDqBlocks, are 64 x 64: each CTA reads one of them, 16 KB in one run).
  static constexpr int kConvertSide = 64;
  FLASHJIT_HOST_DEVICE static constexpr int convert_column_blocks(int head_dim) {
    return (head_dim + kConvertSide - 1) / kConvertSide;
  }
  // Over a fused block (BwdDqBlocks), thread t reads the 16 floats from convert_run(t) on: float
  // 4 q + 2 h + b of them is row convert_row(t) + 8 h, column convert_column(t) + 2 q + b of the
  // block (warp w's rows 16 w.., eight columns at a time).
  FLASHJIT_HOST_DEVICE static constexpr int convert_run(int t) {
    return t / 64 * BwdDqBlocks::kWarpFloats + t % 8 * 128 + t / 8 % 8 * 16;
  }
  FLASHJIT_HOST_DEVICE static constexpr int convert_row(int t) { return 16 * (t / 64) + t / 8 % 8; }
  FLASHJIT_HOST_DEVICE static constexpr int convert_column(int t) { return 8 * (t % 8); }
};

}  // namespace flashjit

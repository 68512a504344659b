// Where the backward keeps its per-row terms (delta, lse_log2) and the fp32 dQ accumulator: rows
// padded to whole tiles, so a tile's terms are whole 16-byte vectors that need no bounds check.
// Read by NVRTC and g++ (src/api/validate_backward.cpp sizes the workspace from it).
//  - Equal-length batches: [batch, heads_q, seqlen_rows], seqlen_rows = seqlen_q padded.
//  - Varlen batches: [heads_q, seqlen_rows], sequence b's rows from packed_first_row(b, its
//    q_start), seqlen_rows = packed_rows(total_q, batch). Each sequence gets its length padded
//    to the quantum before the next begins, and every start is a multiple of it (FlashAttention
//    3's padding of cu_seqlens_q), so a sequence's tiles never reach the next one's rows.
#pragma once

#include "common/host_device.cuh"

namespace flashjit {

struct BwdWorkspaceRows {
  // A multiple of every backward tile_m.
  static constexpr int kRowQuantum = 128;

  FLASHJIT_HOST_DEVICE static constexpr long long padded_rows(long long rows) {
    return (rows + kRowQuantum - 1) / kRowQuantum * kRowQuantum;
  }
  // (q_start + b·Q) rounded down to Q: at least the previous sequence's start plus its padded
  // length, since cu_seqlens_q does not decrease.
  FLASHJIT_HOST_DEVICE static constexpr long long packed_first_row(int batch, long long q_start) {
    return (q_start + static_cast<long long>(batch) * kRowQuantum) / kRowQuantum * kRowQuantum;
  }
  FLASHJIT_HOST_DEVICE static constexpr long long packed_rows(long long total_q, int batch) {
    return padded_rows(total_q + static_cast<long long>(batch) * kRowQuantum);
  }
  // Rows in all.
  FLASHJIT_HOST_DEVICE static constexpr long long total_rows(bool packed, int batch, int heads_q,
                                                             long long seqlen_rows) {
    return (packed ? 1 : static_cast<long long>(batch)) * heads_q * seqlen_rows;
  }
  // The first row of sequence `batch`, query head `head`. (A template: a run-time-looking
  // choice here changes the dense kernels' code even where it folds.)
  template <bool Packed>
  FLASHJIT_HOST_DEVICE static constexpr long long first_row(int batch, int head, int heads_q,
                                                            long long seqlen_rows,
                                                            long long q_start) {
    if constexpr (Packed)
      return head * seqlen_rows + packed_first_row(batch, q_start);
    else
      return (static_cast<long long>(batch) * heads_q + head) * seqlen_rows;
  }
};

// The fused backward's dQ accumulator (bwd_wgmma_fused, BackwardParams::dq_accum_blocks): each
// 64 x 64 block of it (workspace rows 64 r.., columns 64 c..) as 4096 contiguous floats in the
// register order of a wgmma m64n64 fp32 accumulator, so a warpgroup stages its block with
// conflict-free 16-byte stores and the block is added with one 1-D bulk reduction. Row
// 16 w + 8 h + l / 4, column 8 j + 2 (l % 4) + b is warp w's lane l's element 4 j + 2 h + b. Blocks
// follow rows-major over (row block, column block). Other kernels keep it row-major, head_dim
// floats a row.
struct BwdDqBlocks {
  static constexpr int kSide = 64;
  static constexpr int kFloats = kSide * kSide;
  static constexpr int kBytes = kFloats * 4;
  static constexpr int kWarpFloats = kFloats / 4;  // 16 rows: one warp's
  static constexpr int kWarpBytes = kWarpFloats * 4;

  FLASHJIT_HOST_DEVICE static constexpr long long offset(long long row, int col, int head_dim) {
    const int r = static_cast<int>(row % kSide), c = col % kSide;
    return (row / kSide * (head_dim / kSide) + col / kSide) * kFloats + r / 16 * kWarpFloats +
           c / 8 * 128 + (r % 8 * 4 + c % 8 / 2) * 4 + r % 16 / 8 * 2 + c % 2;
  }
};

}  // namespace flashjit

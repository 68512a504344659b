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

}  // namespace flashjit

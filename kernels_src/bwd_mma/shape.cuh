// Geometry of the mma.sync backward kernels (bwd_mma/kernel.cu: dK and dV, with dQ by atomics;
// bwd_mma/dq_kernel.cu: dQ alone, the deterministic mode). Plain C++ read by NVRTC and by g++
// (src/families/bwd_mma), so the launch cannot disagree with the kernels.
#pragma once

#include "common/host_device.cuh"

namespace flashjit {

// From sm_90 on, dQ's part from a step is staged in shared memory and added into the fp32
// accumulator by one bulk reduction (cp.reduce.async.bulk), not an atomic add per element.
FLASHJIT_HOST_DEVICE constexpr bool bulk_dq_reduce(int arch_number) { return arch_number >= 90; }

// dK/dV: a CTA owns tile_n keys of one KV head; each warp 16 of them, and beyond head dim 128 a
// part of the head dim (the accumulators dK and dV of 16 keys at d256 alone would take 256
// registers a thread): `dim_split` warps share a key row, each holding head_dim / dim_split
// columns of dK and dV, and add their partial Sᵀ and dPᵀ through shared memory. It streams
// tile_m query rows a step (Q, dO and their row terms), `stages` buffers deep.
struct BwdMmaShape {
  int head_dim, tile_m, tile_n, stages;
  bool bulk_dq;  // bulk_dq_reduce(the arch): a dQ staging tile

  static constexpr int kElementBytes = 2;  // bf16 and fp16
  FLASHJIT_HOST_DEVICE constexpr int dim_split() const { return head_dim > 128 ? 2 : 1; }
  FLASHJIT_HOST_DEVICE constexpr int key_warps() const { return tile_n / 16; }
  FLASHJIT_HOST_DEVICE constexpr int warps() const { return key_warps() * dim_split(); }
  FLASHJIT_HOST_DEVICE constexpr int threads() const { return warps() * 32; }
  FLASHJIT_HOST_DEVICE constexpr int warp_dims() const { return head_dim / dim_split(); }
  // dQ = dS·K over the CTA's warps: the tile's m16 row tiles times dq_parts column parts.
  FLASHJIT_HOST_DEVICE constexpr int dq_parts() const { return warps() / (tile_m / 16); }
  FLASHJIT_HOST_DEVICE constexpr int dq_dims() const { return head_dim / dq_parts(); }

  // Padded rows (16 bytes): the 8 rows of one ldmatrix phase fall in distinct bank groups.
  FLASHJIT_HOST_DEVICE constexpr int pitch() const { return head_dim + 8; }
  FLASHJIT_HOST_DEVICE constexpr int ds_pitch() const { return tile_m + 8; }
  // Shared memory, in bytes from the start: K and V (the CTA's keys, loaded once), `stages`
  // buffers of Q and of dO, dSᵀ [tile_n][ds_pitch] for dQ, then fp32: `stages` of the row terms
  // (lse_log2 and delta, tile_m each), with a dim split the partial Sᵀ and dPᵀ of every warp,
  // and with bulk_dq the step's dQ part.
  FLASHJIT_HOST_DEVICE constexpr int kv_bytes() const { return tile_n * pitch() * kElementBytes; }
  FLASHJIT_HOST_DEVICE constexpr int q_bytes() const { return tile_m * pitch() * kElementBytes; }
  FLASHJIT_HOST_DEVICE constexpr int k_offset() const { return 0; }
  FLASHJIT_HOST_DEVICE constexpr int v_offset() const { return kv_bytes(); }
  FLASHJIT_HOST_DEVICE constexpr int q_offset(int stage) const {
    return 2 * kv_bytes() + stage * q_bytes();
  }
  FLASHJIT_HOST_DEVICE constexpr int do_offset(int stage) const {
    return 2 * kv_bytes() + (stages + stage) * q_bytes();
  }
  FLASHJIT_HOST_DEVICE constexpr int ds_offset() const {
    return 2 * kv_bytes() + 2 * stages * q_bytes();
  }
  FLASHJIT_HOST_DEVICE constexpr int rows_offset(int stage) const {
    return ds_offset() + tile_n * ds_pitch() * kElementBytes + stage * 2 * tile_m * 4;
  }
  // Per warp: 16 keys x tile_m fp32 for each of Sᵀ and dPᵀ.
  FLASHJIT_HOST_DEVICE constexpr int partial_bytes() const {
    return dim_split() > 1 ? warps() * 2 * 16 * tile_m * 4 : 0;
  }
  FLASHJIT_HOST_DEVICE constexpr int partial_offset() const { return rows_offset(stages); }
  // fp32 [tile_m][head_dim], the accumulator's own layout: one bulk reduction a step.
  FLASHJIT_HOST_DEVICE constexpr int dq_stage_offset() const {
    return partial_offset() + partial_bytes();
  }
  FLASHJIT_HOST_DEVICE constexpr int dq_stage_bytes() const {
    return bulk_dq ? tile_m * head_dim * 4 : 0;
  }
  FLASHJIT_HOST_DEVICE constexpr int shared_bytes() const {
    return dq_stage_offset() + dq_stage_bytes();
  }
};

// dQ alone (deterministic): a CTA owns tile_m query rows of one head, 16 per warp, and streams
// the keys tile_n at a time (K and V, `stages` buffers), summing dQ in registers.
struct BwdMmaDqShape {
  int head_dim, tile_m, tile_n, stages;

  static constexpr int kElementBytes = 2;
  FLASHJIT_HOST_DEVICE constexpr int warps() const { return tile_m / 16; }
  FLASHJIT_HOST_DEVICE constexpr int threads() const { return warps() * 32; }
  FLASHJIT_HOST_DEVICE constexpr int pitch() const { return head_dim + 8; }
  FLASHJIT_HOST_DEVICE constexpr int q_bytes() const { return tile_m * pitch() * kElementBytes; }
  FLASHJIT_HOST_DEVICE constexpr int kv_bytes() const { return tile_n * pitch() * kElementBytes; }
  // Q and dO, then `stages` K and `stages` V buffers.
  FLASHJIT_HOST_DEVICE constexpr int k_offset(int stage) const {
    return 2 * q_bytes() + stage * kv_bytes();
  }
  FLASHJIT_HOST_DEVICE constexpr int v_offset(int stage) const {
    return 2 * q_bytes() + (stages + stage) * kv_bytes();
  }
  FLASHJIT_HOST_DEVICE constexpr int shared_bytes() const {
    return 2 * q_bytes() + 2 * stages * kv_bytes();
  }
};

}  // namespace flashjit

// Geometry of the Hopper backward kernels (sm_90a): bwd_wgmma/kernel.cu (dK and dV, key-major)
// and bwd_wgmma/dq_kernel.cu (dQ, query-major). Plain C++ read by NVRTC and by g++
// (src/families/bwd_wgmma), so the launches cannot disagree with the kernels.
//
// Both kernels are warp-specialized like the forward (wgmma/shape.cuh): warpgroup 0 produces (one
// thread issues TMA loads into 128-byte-swizzled tiles, [head_dim / 64][rows][64] each, which is
// both TMA's box and wgmma's canonical layout), the others consume, 64 rows (wgmma M) each.
#pragma once

#include "common/bwd_workspace.cuh"
#include "common/grouped_order.cuh"
#include "common/host_device.cuh"
#include "common/warpgroup_size.cuh"

namespace flashjit {

struct BwdWgmmaLimits {
  static constexpr int kRowsPerConsumer = 64;  // wgmma M
  static constexpr int kRowBytes = 128;        // one swizzle row: 64 16-bit elements
  static constexpr int kElementBytes = 2;      // bf16 and fp16
  static constexpr int kMaxBoxRows = 256;      // TMA box limit per dimension
  static constexpr int kAlignSlack = 1024;     // the kernels align their tiles to the 1024-B atom
  static constexpr int kMaxSharedBytes = 232448;  // 227 KiB, what an sm_90 block may opt into
  // 65536 registers an SM: two consumers take 240 and the producer 24 (FlashAttention-3's split);
  // one consumer could take more, but every default shape has two.
  static constexpr int kProducerRegisters = 24;
  static constexpr int kConsumerRegisters = 240;
  static constexpr int kMaxConsumers = 2;
};

// dK/dV: a CTA owns tile_n keys of one KV head and streams the query rows that see them, tile_m a
// step (Q, dO and their row terms lse_log2 and delta), `stages` buffers deep, for every query head
// of its GQA group. Up to head dim 128 each consumer owns 64 keys and runs all four GEMMs of a
// step for them, dK and dV in its registers. Beyond (split_roles), dK and dV of 64 keys alone would
// take 256 registers a thread: two consumers share 64 keys, one computing Sᵀ, Pᵀ and dV, the other
// dPᵀ, dSᵀ and dK, Pᵀ passing from the first to the second through shared memory (fp32, in the
// accumulator layout both share); no GEMM is done twice.
struct BwdWgmmaShape {
  int head_dim, tile_m, tile_n, stages;
  // The fused form (family bwd_wgmma_fused): each step also computes dQ = dS·K for its queries
  // and adds it into the fp32 accumulator by bulk reductions, so no dQ kernel follows. dS goes
  // through shared memory (each consumer writes its keys' columns, both read all of them); each
  // consumer computes one 64 x 64 block of the step's dQ (dq_block_row0 / dq_block_col0).
  bool fused_dq = false;

  FLASHJIT_HOST_DEVICE constexpr bool split_roles() const { return head_dim > 128; }
  FLASHJIT_HOST_DEVICE constexpr int key_groups() const {
    return tile_n / BwdWgmmaLimits::kRowsPerConsumer;
  }
  FLASHJIT_HOST_DEVICE constexpr int consumers() const {
    return key_groups() * (split_roles() ? 2 : 1);
  }
  FLASHJIT_HOST_DEVICE constexpr int consumer_warps() const { return consumers() * 4; }
  FLASHJIT_HOST_DEVICE constexpr int threads() const {
    return (consumers() + 1) * kWarpgroupThreads;
  }
  FLASHJIT_HOST_DEVICE constexpr int dim_blocks() const { return head_dim / 64; }
  FLASHJIT_HOST_DEVICE constexpr int kv_bytes() const {
    return tile_n * head_dim * BwdWgmmaLimits::kElementBytes;
  }
  FLASHJIT_HOST_DEVICE constexpr int q_bytes() const {
    return tile_m * head_dim * BwdWgmmaLimits::kElementBytes;
  }
  FLASHJIT_HOST_DEVICE constexpr int terms_bytes() const { return 2 * tile_m * 4; }  // lse, delta
  // Pᵀ of one key group: 64 keys x tile_m queries, fp32.
  FLASHJIT_HOST_DEVICE constexpr int exchange_bytes() const {
    return split_roles() ? key_groups() * BwdWgmmaLimits::kRowsPerConsumer * tile_m * 4 : 0;
  }
  // kv_full, k_empty, v_empty, full[stages], empty[stages], and the taken tiles' slot (two
  // barriers and a word, padded)
  FLASHJIT_HOST_DEVICE constexpr int barrier_bytes() const { return (3 + 2 * stages) * 8 + 24; }
  // Fused dQ: the step's 64 x 64 dQ blocks (tile_m / 64 down, head_dim / 64 across), one per
  // consumer; dS [tile_m queries][tile_n keys] in two buffers (steps alternate, so a consumer
  // writing the next never waits for the other to finish reading the last), K-major and swizzled
  // like TMA's tiles; and the staging of the reductions (below).
  FLASHJIT_HOST_DEVICE constexpr int dq_blocks() const { return tile_m / 64 * (head_dim / 64); }
  FLASHJIT_HOST_DEVICE constexpr int dq_block_row0(int consumer) const {
    return consumer % (tile_m / 64) * 64;
  }
  FLASHJIT_HOST_DEVICE constexpr int dq_block_col0(int consumer) const {
    return consumer / (tile_m / 64) * 64;
  }
  FLASHJIT_HOST_DEVICE constexpr int ds_bytes() const {
    return fused_dq ? tile_m * tile_n * BwdWgmmaLimits::kElementBytes : 0;
  }
  // A warp stages its 16 rows of the block in the accumulator's order (BwdDqBlocks).
  FLASHJIT_HOST_DEVICE constexpr int dq_stage_bytes() const {
    return fused_dq ? consumer_warps() * BwdDqBlocks::kWarpBytes : 0;
  }
  // Shared memory, in order: K and V (the CTA's keys, loaded once), `stages` Q and `stages` dO
  // tiles, `stages` row-term blocks (lse_log2 then delta, tile_m floats each), the Pᵀ exchange,
  // (fused dQ) two dS buffers from the next 1024-byte boundary and the dQ staging, the mbarriers;
  // plus the slack the kernel spends aligning its start to 1024 bytes.
  FLASHJIT_HOST_DEVICE constexpr int k_offset() const { return 0; }
  FLASHJIT_HOST_DEVICE constexpr int v_offset() const { return kv_bytes(); }
  FLASHJIT_HOST_DEVICE constexpr int q_offset(int stage) const {
    return 2 * kv_bytes() + stage * q_bytes();
  }
  FLASHJIT_HOST_DEVICE constexpr int do_offset(int stage) const {
    return 2 * kv_bytes() + (stages + stage) * q_bytes();
  }
  FLASHJIT_HOST_DEVICE constexpr int terms_offset(int stage) const {
    return 2 * kv_bytes() + 2 * stages * q_bytes() + stage * terms_bytes();
  }
  FLASHJIT_HOST_DEVICE constexpr int exchange_offset() const { return terms_offset(stages); }
  FLASHJIT_HOST_DEVICE constexpr int ds_offset(int buffer) const {
    const int end = exchange_offset() + exchange_bytes();
    return (fused_dq ? (end + 1023) / 1024 * 1024 : end) + buffer * ds_bytes();
  }
  FLASHJIT_HOST_DEVICE constexpr int dq_stage_offset() const { return ds_offset(2); }
  FLASHJIT_HOST_DEVICE constexpr int barrier_offset() const {
    return dq_stage_offset() + dq_stage_bytes();
  }
  FLASHJIT_HOST_DEVICE constexpr int shared_bytes() const {
    return barrier_offset() + barrier_bytes() + BwdWgmmaLimits::kAlignSlack;
  }
};

// Which key tile of which (batch, KV head) pair the CTA of linear block index `linear` takes in a
// causal dK/dV grid (tiles key tiles x pairs pairs; CTAs start in block order). A causal key
// tile's work falls from every query step (tile 0) to one; with the key tile fastest, the last
// pair's tile 0 would start when too little else is left to overlap it (a tail of idle SMs). So
// the tiles of kGroup pairs at a time go heaviest first, tile by tile. Groups, not the whole grid:
// the CTAs running at once then share a few pairs' Q and dO in L2.
struct BwdKeyTileOrder {
  static constexpr int kGroup = 4;
  // The key tile is the place's rank within its pair.
  FLASHJIT_HOST_DEVICE static constexpr GroupedTile causal(int linear, int tiles, int pairs) {
    return grouped_tile(linear, tiles, pairs, kGroup);
  }
};

// How the dK/dV CTAs walk the key tiles (key tiles x heads_kv x batch, bwd_wgmma/kernel.cu's
// KeyTileGrid): CTA b takes tiles b, b + grid, ... A grid of one CTA a tile leaves the order to
// the hardware, which starts each next tile on the first SM free: a balanced schedule however
// the tiles' work varies. A persistent grid (one CTA an SM, every CTA taking tiles in turn) loads
// the next tile's K, V and first Q and dO while it finishes and stores the last, instead of paying
// that latency and a CTA's start once a tile. Its static schedule is used where it measured
// faster (session 24, H200): not causal (equal tiles: +6 % at d64 512, +1 % at 16k), and causal
// up to kPersistentCausalTiles key tiles (+8 % at d64 512, +2.7 % at d256 512). At 16 key
// tiles (causal 2k) it lost 1.3 % (d64) and 15 % (d128), at 64–128 (8k–16k) 9–25 %: there the
// hardware's greedy order balances tiles of 1 to 128 steps. Causal launches with a tile counter
// (every one with queries, since session 40) are persistent at every length and take their
// tiles greedily instead (bwd_wgmma/key_tile_walk.cuh): both gains at once (H100: +9 % at d128
// 512, +20 % at 1k, +5 % at d64 2k); the static walk is left to a launch without a workspace.
struct BwdKeyTileWalk {
  static constexpr int kPersistentCausalTiles = 8;
  // Key tiles of one (batch, KV head) pair.
  FLASHJIT_HOST_DEVICE static constexpr int key_tiles(int seqlen_k, int tile_n) {
    return (seqlen_k + tile_n - 1) / tile_n;
  }
  // All of the launch's (the host checks it fits an int).
  FLASHJIT_HOST_DEVICE static constexpr int total(int seqlen_k, int tile_n, int heads_kv,
                                                  int batch) {
    return key_tiles(seqlen_k, tile_n) * heads_kv * batch;
  }
  // `taking`: the launch has a tile counter (BackwardParams::tile_counter), so its causal CTAs
  // take their tiles greedily (bwd_wgmma/key_tile_walk.cuh) and one an SM balances any grid.
  FLASHJIT_HOST_DEVICE static constexpr bool persistent(bool causal, bool taking, int seqlen_k,
                                                        int tile_n) {
    return !causal || taking || key_tiles(seqlen_k, tile_n) <= kPersistentCausalTiles;
  }
};

// dQ: a CTA owns tile_m query rows of one head, 64 per consumer, holds their Q and dO tiles and
// streams the key tiles they see (K and V, `stages` deep), summing dQ in registers.
struct BwdWgmmaDqShape {
  int head_dim, tile_m, tile_n, stages;

  FLASHJIT_HOST_DEVICE constexpr int consumers() const {
    return tile_m / BwdWgmmaLimits::kRowsPerConsumer;
  }
  FLASHJIT_HOST_DEVICE constexpr int consumer_warps() const { return consumers() * 4; }
  FLASHJIT_HOST_DEVICE constexpr int threads() const {
    return (consumers() + 1) * kWarpgroupThreads;
  }
  FLASHJIT_HOST_DEVICE constexpr int dim_blocks() const { return head_dim / 64; }
  FLASHJIT_HOST_DEVICE constexpr int q_bytes() const {
    return tile_m * head_dim * BwdWgmmaLimits::kElementBytes;
  }
  FLASHJIT_HOST_DEVICE constexpr int kv_bytes() const {
    return tile_n * head_dim * BwdWgmmaLimits::kElementBytes;
  }
  FLASHJIT_HOST_DEVICE constexpr int barrier_bytes() const {  // q_full, full[stages], empty[stages]
    return (1 + 2 * stages) * 8;
  }
  // Q, dO, `stages` K, `stages` V, the mbarriers, and the alignment slack.
  FLASHJIT_HOST_DEVICE constexpr int q_offset() const { return 0; }
  FLASHJIT_HOST_DEVICE constexpr int do_offset() const { return q_bytes(); }
  FLASHJIT_HOST_DEVICE constexpr int k_offset(int stage) const {
    return 2 * q_bytes() + stage * kv_bytes();
  }
  FLASHJIT_HOST_DEVICE constexpr int v_offset(int stage) const {
    return 2 * q_bytes() + (stages + stage) * kv_bytes();
  }
  FLASHJIT_HOST_DEVICE constexpr int barrier_offset() const { return v_offset(stages); }
  FLASHJIT_HOST_DEVICE constexpr int shared_bytes() const {
    return barrier_offset() + barrier_bytes() + BwdWgmmaLimits::kAlignSlack;
  }
};

}  // namespace flashjit

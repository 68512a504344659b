// Geometry of the wgmma kernel (wgmma/kernel.cu): warpgroups, registers, shared-memory layout and
// the tile schedule the host fills. Plain C++ read by NVRTC (the kernel) and by g++
// (src/families/wgmma), so the launch cannot disagree with the kernel.
#pragma once

#include "common/host_device.cuh"
#include "common/warpgroup_size.cuh"

namespace flashjit {

// Whether a variant's CTAs may take single causal tiles from FmhaParams::tile_counter
// (wgmma/schedule.cuh's schedule_units): plain dense causal ones, d128 and d256 in 128-row tiles
// and d64 in 192-row ones. Compiled in, the counter's path costs a kernel where it deals its
// units anyway: d64 128 x 128 lost 2-3 % (b32 h32 512, b8 h32 2k), d128 0.5-0.8 %; and the score
// variants' producers and consumers spilled (3.6 -> 11 KB over the 320 causal bf16 variants).
// docs/perf-log.md, sessions 36-37. The host plans by it, the kernels compile by it.
FLASHJIT_HOST_DEVICE constexpr bool may_take_units(bool causal, bool varlen, bool paged,
                                                   bool score_variants, int head_dim, int tile_m) {
  return causal && !varlen && !paged && !score_variants &&
         (head_dim >= 128 ? tile_m == 128 : tile_m == 192);
}

// Whether such a kernel deals the units of the pairs before WgmmaSchedule::taken_from_pair before
// it takes the other pairs' tiles (then the host may set it > 0): d64's 192-row tiles, where it
// paid (docs/perf-log.md, session 37).
FLASHJIT_HOST_DEVICE constexpr bool deals_before_taking(int tile_m) { return tile_m == 192; }

// Which tiles this launch covers and in what order; filled by the host, passed by value after the
// tensor maps q, k, v and o.
struct WgmmaSchedule {
  int m_tiles;          // query tiles per (batch, head)
  int units_per_pair;   // work units per (batch, head): causal pairs of tiles, else single tiles
  int total_units;      // units_per_pair * heads_q * batch, dealt round-robin to the CTAs
  // > 0 (may_take_units): with FmhaParams::tile_counter, the (batch, head) pairs from
  // taken_from_pair on are single query tiles, in groups of this many pairs, in each every pair's
  // costliest tile first, taken by the CTAs as they free up; the units of the pairs before it are
  // dealt round-robin first (wgmma/schedule.cuh's schedule_units). Without a counter every unit
  // is dealt (units_per_pair, total_units).
  int lpt_group_pairs;
  int taken_from_pair;
  // 1 (varlen variants, at most kMaxSortedSequences sequences): the CTAs deal units in order of
  // decreasing cost from a table they build (wgmma/schedule.cuh); total_units is then a bound.
  int sorted_varlen;
  // 1 (paged variants, small pages): the whole producer warpgroup gathers K and V rows with
  // cp.async through the page table; 0: TMA boxes of page-sized runs of rows, issued by one warp.
  int gather_pages;
};

// Pages whose runs of rows (page_box_rows: the largest power of two dividing the page size) are
// shorter than kTmaRunRows are gathered row by row with cp.async by the whole producer warpgroup
// (WgmmaSchedule::gather_pages); the others load in TMA boxes of such runs, which one warp
// issues. H100, b8 x 512 causal queries over 8k keys, d128 (docs/perf-log.md, session 28): rows
// gathered from pages of 16 / 32 take 901 / 895 us where runs of 16 / 32 rows took 1160 / 992;
// at 64 both take 881-885; HND pages of 128: runs 870, gathered 889.
inline constexpr int kTmaRunRows = 64;
// The most keys a paged variant's tile may hold: a gathered tile's rows are 16 a pass, each
// row's page looked up by one of the 8 lanes that copy it (RowGather in wgmma/kernel.cu).
inline constexpr int kMaxPagedTileN = 128;
FLASHJIT_HOST_DEVICE constexpr bool wgmma_gathers_pages(int page_size) {
  return (page_size & -page_size) < kTmaRunRows;
}

struct WgmmaGeometry {
  int head_dim, tile_m, tile_n, stages;
  bool varlen;  // per-sequence lengths (Variant::varlen): the sorted schedule's table is reserved
  // Causal ALiBi without softcap or user functions (takes_causal_alibi): where it fits
  // (alibi_slice), the bias's column part slope · (key - tile start) comes out of Q·Kᵀ as one
  // more k16 slice rather than an FFMA a score in the softmax (wgmma/alibi.cuh, AlibiSlices).
  bool causal_alibi = false;

  // causal_alibi of a variant: ALiBi under causal masking (only there is the bias's column part
  // one rank), not soft-capped (the cap comes before the bias) and without user functions (a
  // score_mod reads each score whole, a mask_mod's tiles are its own).
  FLASHJIT_HOST_DEVICE static constexpr bool takes_causal_alibi(bool alibi, bool causal,
                                                                bool softcap,
                                                                bool user_functions) {
    return alibi && causal && !softcap && !user_functions;
  }

  static constexpr int kRowsPerConsumer = 64;  // one consumer warpgroup per 64 rows (wgmma M)
  // A 128-byte swizzle row holds 64 16-bit elements: tiles are stored as head_dim / 64 column
  // blocks of [rows][64], which is both TMA's box and wgmma's canonical swizzled layout.
  static constexpr int kBoxWidth = 64;
  static constexpr int kRowBytes = 128;
  static constexpr int kMaxBoxRows = 256;   // TMA box limit per dimension
  static constexpr int kElementBytes = 2;   // bf16 and fp16
  static constexpr int kAlignSlack = 1024;  // the kernel aligns its tiles to the 1024-byte atom
  static constexpr int kMaxSharedBytes = 232448;  // 227 KiB: the most a block may opt into (sm_90)
  // Varlen variants sort up to this many sequences; the table (units_end and the batch index per
  // rank) costs 1.5 KB, which every default shape still fits.
  static constexpr int kMaxSortedSequences = 256;
  static constexpr int kTableBytes = kMaxSortedSequences * (4 + 2);
  static constexpr int kTableScratchBytes = 2 * kMaxSortedSequences * 4;  // in the K/V ring

  FLASHJIT_HOST_DEVICE constexpr int consumers() const { return tile_m / kRowsPerConsumer; }
  FLASHJIT_HOST_DEVICE constexpr int threads() const {
    return (consumers() + 1) * kWarpgroupThreads;
  }
  // 65536 registers per SM: the producer keeps 24-32, consumers take the rest (as FA3 does).
  // With two consumers, a paged cache's producer keeps 40 for its row gather's addresses (at 24
  // it spilled) and the consumers 232; the sums match the launch's 168 a thread either way.
  FLASHJIT_HOST_DEVICE constexpr int producer_registers(bool paged = false) const {
    return consumers() == 3 ? 32 : paged ? 40 : 24;
  }
  FLASHJIT_HOST_DEVICE constexpr int consumer_registers(bool paged = false) const {
    return consumers() == 3 ? 160 : paged ? 232 : 240;
  }
  FLASHJIT_HOST_DEVICE constexpr int dim_blocks() const { return head_dim / kBoxWidth; }
  FLASHJIT_HOST_DEVICE constexpr int q_bytes() const { return tile_m * head_dim * kElementBytes; }
  FLASHJIT_HOST_DEVICE constexpr int kv_bytes() const { return tile_n * head_dim * kElementBytes; }
  FLASHJIT_HOST_DEVICE constexpr int o_slice_bytes() const {  // one consumer's rows of O
    return kRowsPerConsumer * head_dim * kElementBytes;
  }
  // PipelineBarriers<stages>: Q's two, four a stage, then UnitRing's two and its unit word.
  FLASHJIT_HOST_DEVICE constexpr int barrier_bytes() const { return (2 + 4 * stages + 2) * 8 + 8; }
  // O is staged in a buffer of its own (not Q's: the next Q loads there during the tile's tail)
  // for three consumers, where it fits beside the pipeline. Measured on an H200
  // (docs/perf-log.md): +0.5-5 % with three 160-register consumers, nothing or a loss with two
  // (d64 128 x 128: -3-5 %), whose 16-byte register stores are as fast.
  FLASHJIT_HOST_DEVICE constexpr bool stages_output() const {
    return consumers() == 3 && q_bytes() + 2 * stages * kv_bytes() + consumers() * o_slice_bytes() +
                                       barrier_bytes() + table_bytes() + kAlignSlack <=
                                   kMaxSharedBytes;
  }
  // Keys ahead: the producer loads K(j + 1) before V(j), and a consumer waits for V(j - 1) only
  // after issuing Q·K(j) (FlashAttention-4's order). Measured on an H200, A/B in one process
  // (docs/perf-log.md, session 6): d128 +1-2 % (16k non-causal 690 -> 703 TFLOPS), d64 causal 16k
  // +2 %, d256 -0.3 to -1 %, which keeps V ahead of the next K.
  FLASHJIT_HOST_DEVICE constexpr bool keys_ahead() const { return head_dim <= 128; }
  // d256 (FlashAttention-4's d256 loop): consumers do not take turns, and O is rescaled right
  // after Q·K(j) is issued, under it, instead of after P·V(j-1). H200, session 7 (ab_compare
  // with FA4): causal 4k / 16k 694.9 / 764.1 -> 713.0 / 795.6 TFLOPS with 128 x 80 tiles (FA4
  // 701.2 / 797.4), non-causal +0.6 %; d64 / d128 keep both (this choice leaves their SASS as it was).
  FLASHJIT_HOST_DEVICE constexpr bool ping_pong() const { return head_dim <= 128; }
  FLASHJIT_HOST_DEVICE constexpr bool rescale_under_qk() const { return head_dim > 128; }
  // Shared memory, in order: Q, Stages x K, Stages x V, O's staging buffer (when staged), the
  // mbarriers, the varlen schedule's table; plus the slack the kernel spends aligning the start
  // to 1024 bytes.
  FLASHJIT_HOST_DEVICE constexpr int q_offset() const { return 0; }
  FLASHJIT_HOST_DEVICE constexpr int k_offset() const { return q_offset() + q_bytes(); }
  FLASHJIT_HOST_DEVICE constexpr int v_offset() const { return k_offset() + stages * kv_bytes(); }
  FLASHJIT_HOST_DEVICE constexpr int o_offset() const { return v_offset() + stages * kv_bytes(); }
  FLASHJIT_HOST_DEVICE constexpr int barrier_offset() const {
    return o_offset() + (stages_output() ? consumers() * o_slice_bytes() : 0);
  }
  FLASHJIT_HOST_DEVICE constexpr int table_bytes() const { return varlen ? kTableBytes : 0; }
  FLASHJIT_HOST_DEVICE constexpr int table_offset() const {
    return barrier_offset() + barrier_bytes();
  }
  // ALiBi's slices (causal_alibi): a k16 slice of Q's rows then one of the key tile's, rows of
  // 32 bytes in wgmma's 32-byte swizzle, whose 8-row atoms want 256-byte alignment.
  static constexpr int kSliceRowBytes = 32;
  static constexpr int kSliceAlign = 256;
  FLASHJIT_HOST_DEVICE constexpr int alibi_slice_offset() const {
    return (table_offset() + table_bytes() + kSliceAlign - 1) / kSliceAlign * kSliceAlign;
  }
  FLASHJIT_HOST_DEVICE constexpr int alibi_slice_bytes() const {
    return (tile_m + tile_n) * kSliceRowBytes;
  }
  FLASHJIT_HOST_DEVICE constexpr bool alibi_slice() const {
    return causal_alibi &&
           alibi_slice_offset() + alibi_slice_bytes() + kAlignSlack <= kMaxSharedBytes;
  }
  FLASHJIT_HOST_DEVICE constexpr int shared_bytes() const {
    return (alibi_slice() ? alibi_slice_offset() + alibi_slice_bytes()
                          : table_offset() + table_bytes()) +
           kAlignSlack;
  }
};

// The kernel's compile-time view of WgmmaGeometry.
template <int HeadDim, int TileM, int TileN, int Stages, bool Varlen = false,
          bool CausalAlibi = false>
struct WgmmaShape {
  static constexpr WgmmaGeometry kGeometry{HeadDim, TileM, TileN, Stages, Varlen, CausalAlibi};
  static constexpr int kConsumers = kGeometry.consumers();
  static constexpr int kThreads = kGeometry.threads();
  template <bool Paged>
  static constexpr int kProducerRegs = kGeometry.producer_registers(Paged);
  template <bool Paged>
  static constexpr int kConsumerRegs = kGeometry.consumer_registers(Paged);
  static constexpr int kDimBlocks = kGeometry.dim_blocks();
  static constexpr int kRowBytes = WgmmaGeometry::kRowBytes;
  static constexpr int kQBytes = kGeometry.q_bytes();
  static constexpr int kKVBytes = kGeometry.kv_bytes();
  static constexpr int kOSliceBytes = kGeometry.o_slice_bytes();
  static constexpr int kBarrierBytes = kGeometry.barrier_bytes();
  static constexpr bool kStageO = kGeometry.stages_output();
  static constexpr bool kKeysAhead = kGeometry.keys_ahead();
  static constexpr bool kPingPong = kGeometry.ping_pong();
  static constexpr bool kRescaleUnderQk = kGeometry.rescale_under_qk();
  static constexpr int kQOffset = kGeometry.q_offset();
  static constexpr int kKOffset = kGeometry.k_offset();
  static constexpr int kVOffset = kGeometry.v_offset();
  static constexpr int kOOffset = kGeometry.o_offset();
  static constexpr int kBarrierOffset = kGeometry.barrier_offset();
  static constexpr int kTableOffset = kGeometry.table_offset();
  static constexpr bool kAlibiSlice = kGeometry.alibi_slice();
  static constexpr int kAlibiQOffset = kGeometry.alibi_slice_offset();
  static constexpr int kAlibiKOffset = kAlibiQOffset + TileM * WgmmaGeometry::kSliceRowBytes;
  static_assert(HeadDim % 64 == 0 && TileM % 64 == 0 && TileN % 16 == 0, "tile shape");
  static_assert(kConsumers >= 1 && kConsumers <= 3, "one to three consumer warpgroups");
  static_assert(kGeometry.shared_bytes() <= WgmmaGeometry::kMaxSharedBytes, "fits shared memory");
  static_assert(2 * Stages * kKVBytes >= WgmmaGeometry::kTableScratchBytes,
                "the K/V ring holds the table's scratch");
};

}  // namespace flashjit

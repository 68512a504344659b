// bwd_wgmma: dK and dV of the Hopper backward (sm_90a only), TMA + wgmma + warp specialization.
//
// A CTA owns TileN keys of one KV head (grid: key tiles x heads_kv x batch) and walks the query
// rows that see them, TileM a step, for every query head of its GQA group (QuerySteps), summing
// dK and dV in registers: no atomics, and nothing written but dk and dv (dQ is dq_kernel.cu's).
// Warpgroup 0 produces: one thread loads K and V once, and per step the Q and dO tiles (TMA) and
// their rows' terms (bulk copies of bwd_rows' lse_log2 and delta) into a ring of Stages buffers
// with full / empty mbarriers. Each consumer warpgroup owns 64 keys, the rows of its accumulators
// (wgmma M), with the step's queries as their columns:
//   Sᵀ = K Qᵀ, dPᵀ = V dOᵀ                          (both operands in shared memory)
//   Pᵀ = exp2(scale_log2 Sᵀ - lse_log2)              (the forward's probabilities, from its LSE)
//   dSᵀ = Pᵀ ∘ (dPᵀ - delta)
//   dV += Pᵀ dO, dK += dSᵀ Q                         (Pᵀ and dSᵀ straight from the registers)
// Beyond head dim 128 two consumers share 64 keys (BwdWgmmaShape::split_roles): one computes Sᵀ,
// Pᵀ and dV, the other dPᵀ, dSᵀ and dK, taking Pᵀ through shared memory.
// FusedDq (family bwd_wgmma_fused, up to head dim 128): each step also gives dQ of its queries,
//   dQ = dS K                                        (dS through shared memory, K the CTA's)
// which the consumers add into the fp32 accumulator (in BwdDqBlocks's order) with bulk reductions
// (bwd_convert scales and rounds it afterwards): one kernel of five GEMMs instead of two of
// seven, and not deterministic.
#include "bwd_wgmma/key_tile_walk.cuh"
#include "bwd_wgmma/shape.cuh"
#include "bwd_wgmma/warp_roles.cuh"
#include "common/bwd_block_mask.cuh"
#include "common/bwd_scores.cuh"
#include "common/fast_math.cuh"
#include "common/grid_dependency.cuh"
#include "common/params.cuh"
#include "common/sequence.cuh"
#include "common/compile_flags.cuh"
#include "common/bwd_workspace.cuh"
#include "common/sm90_mbarrier.cuh"
#include "common/sm90_stmatrix.cuh"
#include "common/sm90_store_rows.cuh"
#include "common/sm90_tile_gemm.cuh"
#include "common/sm90_tma.cuh"
#include "common/sm90_warpgroup.cuh"
#include "common/sm90_wgmma.cuh"
#include "common/types.cuh"

namespace flashjit {

// K and V are released apart: a tile's last step is done with V after its dPᵀ GEMM and with K
// after its dQ GEMM (unfused: after Sᵀ's), so the next tile's V and K load under the step's
// remaining GEMMs instead of after them.
template <int Stages>
struct KeyTileBarriers {
  unsigned long long kv_full;                       // a tile's K and V landed
  unsigned long long k_empty, v_empty;              // a tile's K / V read by every GEMM
  unsigned long long full[Stages], empty[Stages];   // a step's Q, dO and row terms
  KeyTileSlot tiles;                                // taken tiles (key_tile_walk.cuh)
};

// Where a role stands in the CTA's walk over its key tiles: the ring's steps so far (a step's
// stage and phase run on across tiles) and the tiles whose K and V were loaded (kv_full's,
// k_empty's and v_empty's phases). Each role keeps its own copy; all count the same tiles and
// steps.
struct RingPosition {
  int step = 0;
  int kv_loads = 0;
  template <int Stages>
  __device__ __forceinline__ int stage() const { return step % Stages; }
  template <int Stages>
  __device__ __forceinline__ unsigned phase() const { return (step / Stages) & 1; }
};

// The steps of a key tile [key0, key0 + TileN): every query tile holding a row that sees one of
// its keys, for each query head of the KV head's group. Step t is head first_head + t / m_tiles,
// query tile m_first + t % m_tiles. Causal: row i sees key j iff j <= i + seqlen_k - seqlen_q, so
// the rows start where the diagonal reaches key0 (every key is seen by the last row: m_tiles >= 1
// whenever seqlen_q > 0). A window also ends them where its left side leaves the tile's last key
// (common/bwd_scores.cuh, QueryTilesSeeing), so time scales with the window.
// In the block-mask entry (Listed, common/bwd_block_mask.cuh) the steps are the mask's list for
// the key tile: the same order, without the steps it hides wholly, and masked_or(t, ...) true
// only where it hides some score.
template <bool Causal, bool Window, int TileM, int TileN, bool Listed>
struct QuerySteps : ListedSteps<Listed> {
  int m_first, m_tiles, count, first_head;

  __device__ __forceinline__ QuerySteps(const FmhaParams& f, SequenceLengths len, int key0,
                                        int kv_head, int batch) {
    const QueryTilesSeeing<Causal, Window, TileM> tiles(f, len, key0, key0 + TileN - 1);
    m_first = tiles.first;
    m_tiles = tiles.count;
    count = m_tiles * f.heads_per_kv;
    first_head = kv_head * f.heads_per_kv;
    if constexpr (Listed) {
      this->find(f, batch, kv_head, key0 / TileN);
      count = this->count_or(count);
    }
  }
  __device__ __forceinline__ int head(int t) const {
    if constexpr (Listed) return first_head + this->head_offset_or(t, t / m_tiles);
    return first_head + t / m_tiles;
  }
  __device__ __forceinline__ int row0(int t) const {
    if constexpr (Listed) return this->tile_or(t, m_first + t % m_tiles) * TileM;
    return (m_first + t % m_tiles) * TileM;
  }
};

// A (key tile, KV head, batch) of the launch.
struct KeyTileCoords {
  int tile, kv_head, batch;
};

// The launch's key tiles (key tiles x heads_kv x batch, numbered key tile fastest; causal ones in
// BwdKeyTileOrder's order, shape.cuh). The CTAs walk them as KeyTileSequence says: dealt (CTA b
// takes tiles b, b + gridDim.x, ...: one tile a CTA, or a persistent grid whose CTAs load the
// next tile's K, V and first Q while they finish and store the last) or, causal with a tile
// counter, taken in this order as each CTA frees up.
// Computed from the parameters at each use, not held: the producer's walk has 24 registers.
template <int TileN>
struct KeyTileGrid {
  const FmhaParams& f;

  __device__ __forceinline__ int tiles() const {
    return BwdKeyTileWalk::key_tiles(f.seqlen_k, TileN);
  }
  __device__ __forceinline__ int total() const {
    return BwdKeyTileWalk::total(f.seqlen_k, TileN, f.heads_kv, f.batch);
  }
  template <bool Causal>
  __device__ __forceinline__ KeyTileCoords at(int linear) const {
    if constexpr (!Causal) {
      const int pair = linear / tiles();
      return {linear - pair * tiles(), pair % f.heads_kv, pair / f.heads_kv};
    } else {
      const GroupedTile at = BwdKeyTileOrder::causal(linear, tiles(), f.heads_kv * f.batch);
      return {at.rank, at.pair % f.heads_kv, at.pair / f.heads_kv};
    }
  }
};

// Where the CTA works, and how many steps. Varlen: its sequence's lengths and rows (the grid
// covers the longest sequence; a CTA past a shorter one's keys does nothing).
template <bool Causal, bool Window, bool Varlen, int TileM, int TileN, bool Listed>
struct KeyTile {
  int key0, kv_head, batch;
  SequenceSpan seq;  // equal-length batches: the launch's lengths, starts 0
  int coord_batch;   // the TMA maps' batch coordinate: 0 for a packed batch
  QuerySteps<Causal, Window, TileM, TileN, Listed> steps;

  __device__ __forceinline__ KeyTile(const FmhaParams& f, KeyTileCoords at)
      : key0(at.tile * TileN),
        kv_head(at.kv_head),
        batch(at.batch),
        seq(packed_sequence_span<Varlen>(f, at.batch)),
        coord_batch(Varlen ? 0 : at.batch),
        steps(f, lengths_of<Varlen>(f, seq), at.tile * TileN, at.kv_head, at.batch) {}

  __device__ __forceinline__ bool outside() const { return key0 >= seq.seqlen_k; }
  // The first workspace row of query head `head` in this sequence.
  __device__ __forceinline__ long long terms_row(const BackwardParams& p, int head) const {
    return BwdWorkspaceRows::first_row<Varlen>(batch, head, p.fwd.heads_q, p.seqlen_rows,
                                       seq.q_start);
  }
  // Where this tile's KV head of the sequence starts in a [batch, keys, heads_kv, d] tensor.
  __device__ __forceinline__ long long kv_offset(long long stride_b, long long stride_s,
                                                 long long stride_h) const {
    if constexpr (Varlen)
      return seq.k_start * stride_s + kv_head * stride_h;
    else
      return batch * stride_b + kv_head * stride_h;
  }
};

// ---- producer ---------------------------------------------------------------------------------

template <typename T, int HeadDim, int TileM, int TileN, int Stages, bool Causal, bool Window,
          bool Varlen, bool Listed>
__device__ __forceinline__ void produce(const BackwardParams& p,
                                        const KeyTile<Causal, Window, Varlen, TileM, TileN, Listed>& tile,
                                        const TmaDescriptor* tma_q, const TmaDescriptor* tma_k,
                                        const TmaDescriptor* tma_v, const TmaDescriptor* tma_do,
                                        unsigned char* smem, KeyTileBarriers<Stages>* bars,
                                        RingPosition& ring) {
  constexpr BwdWgmmaShape kShape{HeadDim, TileM, TileN, Stages};
  constexpr int kRow = BwdWgmmaLimits::kRowBytes;
  if (tile.steps.count == 0) return;  // no row sees these keys: the consumers write zeros
  // The whole warp walks the tiles and waits, one lane issues: the walk's values are then
  // warp-uniform, in uniform registers (in one thread's 24 they spilled).
  const bool issuer = threadIdx.x % 32 == 0;
  // K and V go once the consumers have read the last tile's (a fresh barrier counts as having
  // completed the phase before phase 0: parity ^ 1 passes).
  auto load_keys = [&] {
    const unsigned parity = (ring.kv_loads & 1) ^ 1;
    ++ring.kv_loads;
    // V first: the last tile is done with it before K.
    auto load = [&](const TmaDescriptor* map, int offset) {
      if (!issuer) return;
#pragma unroll
      for (int b = 0; b < kShape.dim_blocks(); ++b)
        tma_load_4d(smem + offset + b * TileN * kRow, map, &bars->kv_full, 64 * b,
                    tile.seq.k_start + tile.key0, tile.kv_head, tile.coord_batch);
    };
    mbarrier_wait(&bars->v_empty, parity);
    if (issuer) mbarrier_arrive_expect_tx(&bars->kv_full, 2 * kShape.kv_bytes());
    load(tma_v, kShape.v_offset());
    mbarrier_wait(&bars->k_empty, parity);
    load(tma_k, kShape.k_offset());
  };
  auto load_step = [&](int t) {
    const int stage = ring.stage<Stages>();
    // Free once every consumer warp is done with the step Stages before.
    mbarrier_wait(&bars->empty[stage], ring.phase<Stages>() ^ 1);
    ++ring.step;
    if (!issuer) return;
    mbarrier_arrive_expect_tx(&bars->full[stage], 2 * kShape.q_bytes() + kShape.terms_bytes());
    const int head = tile.steps.head(t), row0 = tile.steps.row0(t);
#pragma unroll
    for (int b = 0; b < kShape.dim_blocks(); ++b) {
      tma_load_4d(smem + kShape.q_offset(stage) + b * TileM * kRow, tma_q, &bars->full[stage],
                  64 * b, tile.seq.q_start + row0, head, tile.coord_batch);
      tma_load_4d(smem + kShape.do_offset(stage) + b * TileM * kRow, tma_do, &bars->full[stage],
                  64 * b, tile.seq.q_start + row0, head, tile.coord_batch);
    }
    // The workspace's rows are padded to whole tiles (common/bwd_workspace.cuh): TileM floats
    // each, aligned. Query rows past a varlen sequence's end are the next one's: their padded
    // terms (+inf lse_log2) give them probability 0.
    const long long terms = tile.terms_row(p, head) + row0;
    unsigned char* terms_tile = smem + kShape.terms_offset(stage);
    bulk_load(terms_tile, p.lse_log2 + terms, TileM * 4, &bars->full[stage]);
    bulk_load(terms_tile + TileM * 4, p.delta + terms, TileM * 4, &bars->full[stage]);
  };
  // The first step's Q and dO before K and V: they may load while the consumers finish the last
  // tile.
  load_step(0);
  load_keys();
  for (int t = 1; t < tile.steps.count; ++t) load_step(t);
}

// ---- consumer pieces --------------------------------------------------------------------------

// Sᵀ -> Pᵀ in place: columns are queries row0 + 8 (e / 4) + at.col + e % 2, whose lse_log2 come
// from the step's terms. Keys past seqlen_k are zero rows of K and V: their probabilities reach
// only dK and dV rows that are never stored, so only the scores' own masks apply (`masked`: some
// score of the warpgroup's block is masked; the fused varlen kernel's masks include the keys past
// the sequence, kKeyEnd in consume_keys). With Gradients (soft-capped
// variants, whose dS needs each score's t) dPᵀ -> dSᵀ in `dp` in the same pass.
template <int TileM, bool Gradients, typename Scores>
__device__ __forceinline__ void probabilities(float (&s)[TileM / 2], float (&dp)[TileM / 2],
                                              const float* terms, const FragmentPosition& at,
                                              const Scores& scores, bool masked, int lane_key,
                                              int row0) {
  // Masked blocks test each score's row against the range of rows its key is seen by
  // (rows_seeing), not visible()'s offsets: fewer values live across the pass (the fused d64
  // kernel with varlen, softcap and window spilled 188 B; 16 of the 320 sm_90a dK/dV variants
  // with softcap, window and ALiBi both spilled 8-188 B, none now).
  constexpr bool kByRows = Scores::kMasks && !user::kMaskMod;
#pragma unroll
  for (int j = 0; j < TileM / 8; ++j) {
    const int col = 8 * j + at.col;
    const float2 lse = *reinterpret_cast<const float2*>(terms + col);
    const float2 delta = Gradients ? *reinterpret_cast<const float2*>(terms + TileM + col)
                                   : make_float2(0.f, 0.f);
#pragma unroll
    for (int h = 0; h < 2; ++h)
#pragma unroll
      for (int b = 0; b < 2; ++b) {
        const int e = 4 * j + 2 * h + b;
        ScoreDerivative derivative;
        float prob = scores.prob(s[e], b ? lse.y : lse.x, row0 + col + b, lane_key + 8 * h,
                                 masked && !kByRows, derivative);
        if (kByRows && masked && !scores.rows_seeing(lane_key + 8 * h).hold(row0 + col + b))
          prob = 0.f;
        if constexpr (Gradients)
          dp[e] = Scores::gradient(prob, dp[e], b ? delta.y : delta.x, derivative);
        s[e] = prob;
      }
  }
}

// dPᵀ -> dSᵀ = Pᵀ ∘ (dPᵀ - delta) in place; `prob(e)` gives Pᵀ's element e.
template <int TileM, typename Prob>
__device__ __forceinline__ void score_gradients(float (&dp)[TileM / 2], const float* terms,
                                                const FragmentPosition& at, Prob&& prob) {
#pragma unroll
  for (int j = 0; j < TileM / 8; ++j) {
    const float2 delta = *reinterpret_cast<const float2*>(terms + TileM + 8 * j + at.col);
#pragma unroll
    for (int h = 0; h < 2; ++h)
#pragma unroll
      for (int b = 0; b < 2; ++b) {
        const int e = 4 * j + 2 * h + b;
        dp[e] = prob(e) * (dp[e] - (b ? delta.y : delta.x));
      }
  }
}

// Fused dQ: the named barrier at which both consumers have written their columns of a step's dS
// (0 is __syncthreads'; split roles, which never fuse, use 1 and up too).
constexpr int kDsWrittenBarrier = 1;

// Fused dQ: dSᵀ's fragments (gemm_fragments of this consumer's 64 keys x TileM queries), stored
// transposed into the consumer's column block of dS [TileM queries][TileN keys] at `ds_tile`
// (K-major, 128B-swizzled: block c holds keys 64 c .. 64 c + 63). Fragment kk, matrix m holds
// keys 16 warp + 8 (m % 2) and queries 16 kk + 8 (m / 2), 8 each; stmatrix's lane 8 m + r gives
// query row 16 kk + 8 (m / 2) + r, whose 16-byte unit 2 warp + m % 2 the swizzle moves by r.
template <int TileM>
__device__ __forceinline__ void store_score_gradients(unsigned ds_tile, int consumer,
                                                      const unsigned (&dsf)[TileM / 16][4]) {
  constexpr int kRow = BwdWgmmaLimits::kRowBytes;
  const int lane = threadIdx.x % 32, warp = (threadIdx.x / 32) % 4;
  const int unit = 2 * warp + (lane / 8) % 2;
  const unsigned lane_addr = ds_tile + consumer * TileM * kRow + (8 * (lane / 16) + lane % 8) * kRow +
                             ((unit ^ (lane % 8)) << 4);
#pragma unroll
  for (int kk = 0; kk < TileM / 16; ++kk) stmatrix_x4_trans(lane_addr + kk * 16 * kRow, dsf[kk]);
}

// Fused dQ: a consumer hands its finished 64 x 64 block of a step's dQ to the producer
// warpgroup's second warp (write_dq), which adds it into the accumulator with one bulk reduction,
// so the consumers only store and fence. Named barriers pair each consumer with that warp:
// kDqFullBarrier + c (the block is staged), kDqEmptyBarrier + c (the reduction has read it).
constexpr int kDqFullBarrier = 2, kDqEmptyBarrier = 4;
static_assert(kDsWrittenBarrier < kDqFullBarrier &&
                  kDqFullBarrier + BwdWgmmaLimits::kMaxConsumers <= kDqEmptyBarrier &&
                  kDqEmptyBarrier + BwdWgmmaLimits::kMaxConsumers <= 16,
              "one hardware barrier per role and consumer, 0 being __syncthreads'");
constexpr int kDqHandoffThreads = kWarpgroupThreads + 32;

// Where consumer c's block of a step's dQ is staged (BwdDqBlocks::kBytes).
__device__ __forceinline__ unsigned char* dq_stage(unsigned char* smem, const BwdWgmmaShape& shape,
                                                   int consumer) {
  return smem + shape.dq_stage_offset() + consumer * BwdDqBlocks::kBytes;
}

// Stages the block in the accumulator's order (BwdDqBlocks): each thread's eight float4 at
// 512 i + 16 lane of its warp's 4 KB, no bank conflicts, no swizzle arithmetic.
__device__ __forceinline__ void stage_dq_block(unsigned char* stage, int consumer,
                                               const float (&dq)[32]) {
  const int lane = threadIdx.x % 32, warp = (threadIdx.x / 32) % 4;
  unsigned char* staged = stage + BwdDqBlocks::kWarpBytes * warp;
  named_barrier_sync(kDqEmptyBarrier + consumer, kDqHandoffThreads);
#pragma unroll
  for (int i = 0; i < 8; ++i)
    *reinterpret_cast<float4*>(staged + 512 * i + 16 * lane) =
        make_float4(dq[4 * i], dq[4 * i + 1], dq[4 * i + 2], dq[4 * i + 3]);
  fence_proxy_async_shared();  // the generic-proxy writes, before the bulk copy reads them
  named_barrier_arrive(kDqFullBarrier + consumer, kDqHandoffThreads);
}

// Fused dQ (the producer warpgroup's second warp): walks the tile's steps as the consumers do,
// adds each consumer's staged block of each step into the accumulator, one 16 KB bulk reduction
// a block, and frees the staging once the reduction has read it. It finds each block's
// destination itself: handing it over from the consumers, with an end mark after their last
// tile, made ptxas recompute the consumers' shared-memory addresses every step (+40
// instructions a step, session 24).
template <int HeadDim, int TileM, int TileN, int Stages, bool Causal, bool Window, bool Varlen,
          bool Listed>
__device__ __forceinline__ void write_dq(const BackwardParams& p,
                                         const KeyTile<Causal, Window, Varlen, TileM, TileN, Listed>& tile,
                                         unsigned char* smem) {
  constexpr BwdWgmmaShape kShape{HeadDim, TileM, TileN, Stages, true};
  const bool leader = threadIdx.x % 32 == 0;
  if (tile.steps.count == 0) return;  // the consumers stage nothing for this tile
  // The staging is free: the last tile's reductions were read before its last step ended.
  for (int c = 0; c < kShape.consumers(); ++c)
    named_barrier_arrive(kDqEmptyBarrier + c, kDqHandoffThreads);
  for (int t = 0; t < tile.steps.count; ++t) {
    const long long first_row = tile.terms_row(p, tile.steps.head(t)) + tile.steps.row0(t);
    for (int c = 0; c < kShape.consumers(); ++c) {
      named_barrier_sync(kDqFullBarrier + c, kDqHandoffThreads);
      if (leader) {
        bulk_reduce_add_f32(p.dq_accum + BwdDqBlocks::offset(first_row + kShape.dq_block_row0(c),
                                                             kShape.dq_block_col0(c), HeadDim),
                            smem_u32(dq_stage(smem, kShape, c)), BwdDqBlocks::kBytes);
        bulk_commit_group();
        bulk_wait_group_read<0>();
      }
      __syncwarp();
      // After the tile's last step the next tile's first arrival frees it.
      if (t + 1 < tile.steps.count) named_barrier_arrive(kDqEmptyBarrier + c, kDqHandoffThreads);
    }
  }
}

// ---- consumers --------------------------------------------------------------------------------

// Up to head dim 128: the warpgroup owns keys [key_row0, key_row0 + 64) of the tile and runs the
// whole step for them.
template <typename T, int HeadDim, int TileM, int TileN, int Stages, bool Causal, bool Softcap,
          bool Window, bool Alibi, bool Varlen, bool FusedDq, bool Listed>
__device__ __forceinline__ void consume_keys(const BackwardParams& p,
                                             const KeyTile<Causal, Window, Varlen, TileM, TileN, Listed>& tile,
                                             unsigned char* smem, KeyTileBarriers<Stages>* bars,
                                             int consumer, RingPosition& ring) {
  constexpr BwdWgmmaShape kShape{HeadDim, TileM, TileN, Stages, FusedDq};
  constexpr int kRow = BwdWgmmaLimits::kRowBytes;
  // Keys past seqlen_k reach dQ (through K) only in the fused kernel; there a varlen tile holds
  // the next sequence's keys, not TMA's zeros, so they are masked.
  constexpr bool kKeyEnd = FusedDq && Varlen;
  const FmhaParams& f = p.fwd;
  const FragmentPosition at;
  const unsigned base = smem_u32(smem);
  const int key_row0 = consumer * 64;
  const unsigned k_rows = base + kShape.k_offset() + key_row0 * kRow;  // this warpgroup's keys
  const unsigned v_rows = base + kShape.v_offset() + key_row0 * kRow;
  const int lane_key = tile.key0 + key_row0 + at.row;  // the accumulators' rows: + 0, + 8
  float dk[HeadDim / 2], dv[HeadDim / 2];
#pragma unroll
  for (int e = 0; e < HeadDim / 2; ++e) dk[e] = dv[e] = 0.f;

  // Fused, where the registers allow (not at 128 queries a step with ALiBi or a per-score
  // factor: those serialize the wgmma or spill), FA4's order, which stages dQ under dK's GEMM.
  using Scores = BackwardScores<Causal, Softcap, Window, Alibi, kKeyEnd>;
  constexpr bool kDqUnderDk = FusedDq && (TileM == 64 || !(Alibi || Scores::kPerScoreFactor));
  unsigned char* const dq_block = dq_stage(smem, kShape, consumer);
  // Both consumers' columns of dS are written (their generic-proxy stores made visible to
  // wgmma's async proxy first); this consumer's dQ block is dS's rows dq_row0.. times K's
  // columns dq_col0...
  auto issue_dq = [&](float (&dq)[32], unsigned ds_tile) {
    fence_proxy_async_shared();
    named_barrier_sync(kDsWrittenBarrier, 2 * kWarpgroupThreads);
    gemm_ss_tnsp_b_tiles<T, 64, TileN, TileM>(
        dq, ds_tile + kShape.dq_block_row0(consumer) * kRow,
        base + kShape.k_offset() + kShape.dq_block_col0(consumer) / 64 * TileN * kRow);
  };

  if (tile.steps.count > 0) mbarrier_wait(&bars->kv_full, ring.kv_loads & 1);
  for (int t = 0; t < tile.steps.count; ++t, ++ring.step) {
    const int stage = ring.stage<Stages>();
    mbarrier_wait(&bars->full[stage], ring.phase<Stages>());
    const unsigned q_tile = base + kShape.q_offset(stage), do_tile = base + kShape.do_offset(stage);
    const float* terms = reinterpret_cast<const float*>(smem + kShape.terms_offset(stage));
    const bool last = t + 1 == tile.steps.count;
    float s[TileM / 2], dp[TileM / 2];
    gemm_ss_tiles<T, HeadDim, TileN, TileM>(s, k_rows, q_tile);
    gemm_ss_tiles<T, HeadDim, TileN, TileM>(dp, v_rows, do_tile);
    const int row0 = tile.steps.row0(t);
    const Scores scores(f, lengths_of<Varlen>(f, tile.seq), tile.batch, tile.steps.head(t));
    // Fused, both consumers meet at one bar.sync a step (dS written), which is .aligned: every
    // thread of a generation must reach the same instruction, so both take the same copy of
    // the step below and the test spans the tile's keys (synccheck reported the two copies'
    // barriers as divergent). It costs no time: that barrier makes each step as long as its
    // slower consumer's anyway. Unfused, each consumer decides for its own 64 keys.
    const int first_key = FusedDq ? tile.key0 : lane_key - at.row;
    const int last_key = FusedDq ? tile.key0 + TileN - 1 : lane_key - at.row + 63;
    bool masked = scores.any_masked(row0, row0 + TileM - 1, first_key, last_key);
    if constexpr (Listed) masked = tile.steps.masked_or(t, masked);
    // The rest of the step written once, compiled twice where scores can be masked: the steps
    // that mask none (all but a causal key tile's diagonal ones) run a copy without the
    // per-score test.
    auto finish_step = [&](auto masks) {
      constexpr bool kMasked = decltype(masks)::value;
      // dSᵀ needs a factor of each score's (a cap's t, a score_mod's derivative): both GEMMs
      // first, then one pass.
      if constexpr (Scores::kPerScoreFactor) {
        wgmma_wait<0>();
        wgmma_fence_operands(s);
        wgmma_fence_operands(dp);
        if (last) {
          release_stage(&bars->v_empty);
          if (!FusedDq) release_stage(&bars->k_empty);
        }
        probabilities<TileM, true>(s, dp, terms, at, scores, kMasked, lane_key, row0);
      } else {
        wgmma_wait<1>();  // Sᵀ is ready; dPᵀ may still run
        wgmma_fence_operands(s);
        if (!FusedDq && last) release_stage(&bars->k_empty);
        probabilities<TileM, false>(s, dp, terms, at, scores, kMasked, lane_key, row0);
        wgmma_wait<0>();  // dPᵀ is ready
        wgmma_fence_operands(dp);
        if (last) release_stage(&bars->v_empty);
        score_gradients<TileM>(dp, terms, at, [&](int e) { return s[e]; });
      }
      unsigned dsf[TileM / 16][4];
      gemm_fragments<T, TileM>(dsf, dp);
      const unsigned ds_tile = base + kShape.ds_offset(ring.step % 2);
      unsigned pf[TileM / 16][4];
      [[maybe_unused]] float dq[FusedDq ? 32 : 1];  // unused without FusedDq (NVRTC #177-D)
      if constexpr (kDqUnderDk) {
        // dV, dQ, then dK: dQ's block is staged while dK's GEMM runs.
        gemm_fragments<T, TileM>(pf, s);
        gemm_rs_tiles<T, HeadDim, TileM>(dv, pf, do_tile);
        store_score_gradients<TileM>(ds_tile, consumer, dsf);
        issue_dq(dq, ds_tile);
        gemm_rs_tiles<T, HeadDim, TileM>(dk, dsf, q_tile);
        wgmma_wait<1>();  // dV and dQ are done; dK runs
        wgmma_fence_operands(dq);
        if (last) release_stage(&bars->k_empty);
        stage_dq_block(dq_block, consumer, dq);
      } else {
        // dK's GEMM first: dPᵀ's registers free up as its fragments are packed, then Sᵀ's as
        // Pᵀ's are, which the kernels excluded above need.
        gemm_rs_tiles<T, HeadDim, TileM>(dk, dsf, q_tile);
        if constexpr (FusedDq) store_score_gradients<TileM>(ds_tile, consumer, dsf);
        gemm_fragments<T, TileM>(pf, s);
        gemm_rs_tiles<T, HeadDim, TileM>(dv, pf, do_tile);
        if constexpr (FusedDq) issue_dq(dq, ds_tile);
      }
      wgmma_wait<0>();
      wgmma_fence_operands(dv);
      wgmma_fence_operands(dk);
      // The fragments' registers stay reserved until the GEMMs reading them are done.
      wgmma_fence_operands(pf);
      wgmma_fence_operands(dsf);
      if (FusedDq && !kDqUnderDk && last) release_stage(&bars->k_empty);
      release_stage(&bars->empty[stage]);
      if constexpr (FusedDq && !kDqUnderDk) {
        wgmma_fence_operands(dq);
        stage_dq_block(dq_block, consumer, dq);
      }
    };
    if constexpr (Scores::kMasks) {
      if (masked)
        finish_step(True{});
      else
        finish_step(False{});
    } else {
      finish_step(False{});
    }
  }
  if (tile.steps.count > 0) ++ring.kv_loads;  // K and V were released by the last step

  // dK = softmax_scale · dSᵀ Q (S was scale · q·k); keys past seqlen_k are not stored.
  store_accumulator_rows<T, HeadDim>(
      static_cast<T*>(p.dk) + tile.kv_offset(p.dk_stride_b, p.dk_stride_s, p.dk_stride_h),
      p.dk_stride_s, tile.key0 + key_row0, lengths_of<Varlen>(f, tile.seq).seqlen_k, dk,
      p.dscore_scale);
  store_accumulator_rows<T, HeadDim>(
      static_cast<T*>(p.dv) + tile.kv_offset(p.dv_stride_b, p.dv_stride_s, p.dv_stride_h),
      p.dv_stride_s, tile.key0 + key_row0, lengths_of<Varlen>(f, tile.seq).seqlen_k, dv, 1.f);
}

// Beyond head dim 128: consumers 2g and 2g + 1 share keys [64 g, 64 g + 64) of the tile. The
// first computes Sᵀ, Pᵀ and dV, the second dPᵀ, dSᵀ and dK, so each holds one 64 x HeadDim
// accumulator. Pᵀ goes through the group's exchange buffer in fp32 (the bits bwd_mma's dSᵀ uses)
// as element e of thread i at float4 [e / 4][i]: both warpgroups have the same accumulator
// layout, so thread i of the second reads exactly its own elements, and consecutive threads touch
// consecutive 16 bytes. Named barriers 1 + 2g (Pᵀ written) and 2 + 2g (Pᵀ read, the buffer free)
// pass it over, both warpgroups' 256 threads counting.
template <typename T, int HeadDim, int TileM, int TileN, int Stages, bool Causal, bool Softcap,
          bool Window, bool Alibi, bool Varlen, bool Probs, bool Listed>
__device__ __forceinline__ void consume_split(const BackwardParams& p,
                                              const KeyTile<Causal, Window, Varlen, TileM, TileN, Listed>& tile,
                                              unsigned char* smem, KeyTileBarriers<Stages>* bars,
                                              int group, RingPosition& ring) {
  constexpr BwdWgmmaShape kShape{HeadDim, TileM, TileN, Stages};
  constexpr int kRow = BwdWgmmaLimits::kRowBytes;
  constexpr int kPairThreads = 2 * kWarpgroupThreads;
  const FmhaParams& f = p.fwd;
  const FragmentPosition at;
  const unsigned base = smem_u32(smem);
  const int key_row0 = group * 64;
  const int written = 1 + 2 * group, free = 2 + 2 * group;
  float4* exchange = reinterpret_cast<float4*>(smem + kShape.exchange_offset()) +
                     group * (64 * TileM / 4) + threadIdx.x % kWarpgroupThreads;
  float acc[HeadDim / 2];  // dV (Probs), dK (the gradients' warpgroup)
#pragma unroll
  for (int e = 0; e < HeadDim / 2; ++e) acc[e] = 0.f;

  if (tile.steps.count > 0) {
    if (!Probs) named_barrier_arrive(free, kPairThreads);  // the buffer starts free
    mbarrier_wait(&bars->kv_full, ring.kv_loads & 1);
  }
  for (int t = 0; t < tile.steps.count; ++t, ++ring.step) {
    const int stage = ring.stage<Stages>();
    mbarrier_wait(&bars->full[stage], ring.phase<Stages>());
    const unsigned q_tile = base + kShape.q_offset(stage), do_tile = base + kShape.do_offset(stage);
    const float* terms = reinterpret_cast<const float*>(smem + kShape.terms_offset(stage));
    float x[TileM / 2];  // Sᵀ then Pᵀ (Probs), dPᵀ then dSᵀ
    unsigned frag[TileM / 16][4];
    if constexpr (Probs) {
      gemm_ss_tiles<T, HeadDim, TileN, TileM>(x, base + kShape.k_offset() + key_row0 * kRow,
                                              q_tile);
      wgmma_wait<0>();
      wgmma_fence_operands(x);
      if (t + 1 == tile.steps.count) release_stage(&bars->k_empty);  // only Sᵀ reads K
      const int row0 = tile.steps.row0(t), lane_key = tile.key0 + key_row0 + at.row;
      using Scores = BackwardScores<Causal, Softcap, Window, Alibi>;
      const Scores scores(f, lengths_of<Varlen>(f, tile.seq), tile.batch, tile.steps.head(t));
      bool masked =
          scores.any_masked(row0, row0 + TileM - 1, tile.key0 + key_row0, tile.key0 + key_row0 + 63);
      if constexpr (Listed) masked = tile.steps.masked_or(t, masked);
      if constexpr (Scores::kPerScoreFactor) {
        // The partner's dSᵀ is Pᵀ (1 - t²) g ∘ (dPᵀ - delta) (g: score_mod's derivative): that
        // goes over, written as each group of four is computed (no second array of registers),
        // Pᵀ stays for dV.
        named_barrier_sync(free, kPairThreads);  // the partner has read the last step's
#pragma unroll
        for (int i = 0; i < TileM / 8; ++i) {
          float capped[4];
#pragma unroll
          for (int q = 0; q < 4; ++q) {
            const int e = 4 * i + q, col = 8 * i + at.col + q % 2;
            ScoreDerivative derivative;
            x[e] = scores.prob(x[e], terms[col], row0 + col, lane_key + 8 * (q / 2), masked,
                               derivative);
            capped[q] = Scores::capped(x[e], derivative);
          }
          exchange[i * kWarpgroupThreads] = make_float4(capped[0], capped[1], capped[2], capped[3]);
        }
      } else {
        probabilities<TileM, false>(x, x, terms, at, scores, masked, lane_key, row0);
        named_barrier_sync(free, kPairThreads);  // the partner has read the last step's Pᵀ
#pragma unroll
        for (int i = 0; i < TileM / 8; ++i)
          exchange[i * kWarpgroupThreads] =
              make_float4(x[4 * i], x[4 * i + 1], x[4 * i + 2], x[4 * i + 3]);
      }
      named_barrier_arrive(written, kPairThreads);
      gemm_fragments<T, TileM>(frag, x);
      gemm_rs_tiles<T, HeadDim, TileM>(acc, frag, do_tile);
    } else {
      gemm_ss_tiles<T, HeadDim, TileN, TileM>(x, base + kShape.v_offset() + key_row0 * kRow,
                                              do_tile);
      wgmma_wait<0>();
      wgmma_fence_operands(x);
      if (t + 1 == tile.steps.count) release_stage(&bars->v_empty);  // only dPᵀ reads V
      named_barrier_sync(written, kPairThreads);
      float prob[TileM / 2];
#pragma unroll
      for (int i = 0; i < TileM / 8; ++i) {
        const float4 four = exchange[i * kWarpgroupThreads];
        prob[4 * i] = four.x;
        prob[4 * i + 1] = four.y;
        prob[4 * i + 2] = four.z;
        prob[4 * i + 3] = four.w;
      }
      if (t + 1 < tile.steps.count) named_barrier_arrive(free, kPairThreads);
      score_gradients<TileM>(x, terms, at, [&](int e) { return prob[e]; });
      gemm_fragments<T, TileM>(frag, x);
      gemm_rs_tiles<T, HeadDim, TileM>(acc, frag, q_tile);
    }
    wgmma_wait<0>();
    wgmma_fence_operands(acc);
    wgmma_fence_operands(frag);  // its registers stay reserved until the GEMM reading them is done
    release_stage(&bars->empty[stage]);
  }
  if (tile.steps.count > 0) ++ring.kv_loads;  // K and V were released by the last step

  // dK = softmax_scale · dSᵀ Q; keys past seqlen_k are not stored.
  if constexpr (Probs)
    store_accumulator_rows<T, HeadDim>(
        static_cast<T*>(p.dv) + tile.kv_offset(p.dv_stride_b, p.dv_stride_s, p.dv_stride_h),
        p.dv_stride_s, tile.key0 + key_row0, lengths_of<Varlen>(f, tile.seq).seqlen_k, acc, 1.f);
  else
    store_accumulator_rows<T, HeadDim>(
        static_cast<T*>(p.dk) + tile.kv_offset(p.dk_stride_b, p.dk_stride_s, p.dk_stride_h),
        p.dk_stride_s, tile.key0 + key_row0, lengths_of<Varlen>(f, tile.seq).seqlen_k, acc,
        p.dscore_scale);
}

// ---- kernel -----------------------------------------------------------------------------------

// BlockMask: the entry that reads a block mask (FmhaParams::block_*), compiled beside the other
// for variants with a mask_mod.
template <typename T, int HeadDim, int TileM, int TileN, int Stages, bool Causal, bool Softcap,
          bool Window, bool Alibi, bool Varlen, bool FusedDq, bool BlockMask = false>
__global__ void __launch_bounds__(BwdWgmmaShape{HeadDim, TileM, TileN, Stages, FusedDq}.threads(), 1)
    bwd_wgmma_kernel(const BackwardParams p, const __grid_constant__ TmaDescriptor tma_q,
                     const __grid_constant__ TmaDescriptor tma_k,
                     const __grid_constant__ TmaDescriptor tma_v,
                     const __grid_constant__ TmaDescriptor tma_do) {
  begin_after_previous_grid();
  constexpr BwdWgmmaShape kShape{HeadDim, TileM, TileN, Stages, FusedDq};
  static_assert(HeadDim % 64 == 0 && TileM % 64 == 0 && TileN % 64 == 0, "whole swizzled tiles");
  static_assert(TileM <= BwdWgmmaLimits::kMaxBoxRows && TileN <= BwdWgmmaLimits::kMaxBoxRows,
                "one TMA box per column block");
  static_assert(kShape.consumers() >= 1 && kShape.consumers() <= BwdWgmmaLimits::kMaxConsumers,
                "one or two consumer warpgroups");
  static_assert(kShape.shared_bytes() <= BwdWgmmaLimits::kMaxSharedBytes, "fits shared memory");
  static_assert(sizeof(KeyTileBarriers<Stages>) == kShape.barrier_bytes(), "barrier bytes");
  static_assert(!BlockMask || user::kMaskMod, "block masks come with a mask_mod");
  static_assert(!FusedDq || (!kShape.split_roles() && kShape.consumers() == 2 &&
                             kShape.dq_blocks() == kShape.consumers()),
                "fused dQ: two consumers of 64 keys, one 64 x 64 dQ block each");
  extern __shared__ unsigned char smem_raw[];
  unsigned char* smem = aligned_tiles(smem_raw);
  auto* bars = reinterpret_cast<KeyTileBarriers<Stages>*>(smem + kShape.barrier_offset());
  const KeyTileGrid<TileN> grid{p.fwd};

  if (threadIdx.x == 0) {
    mbarrier_init(&bars->kv_full, 1);
    // Split roles: K is read by the warpgroups of Sᵀ only, V by those of dPᵀ.
    const int key_readers = kShape.consumer_warps() / (kShape.split_roles() && !FusedDq ? 2 : 1);
    mbarrier_init(&bars->k_empty, key_readers);
    mbarrier_init(&bars->v_empty, key_readers);
    mbarrier_init(&bars->tiles.full, 1);
    // Every warp that walks the tiles: the producer's, write_dq's, the consumers'.
    mbarrier_init(&bars->tiles.empty, 1 + (FusedDq ? 1 : 0) + kShape.consumer_warps());
    for (int s = 0; s < Stages; ++s) {
      mbarrier_init(&bars->full[s], 1);
      mbarrier_init(&bars->empty[s], kShape.consumer_warps());
    }
    mbarrier_init_fence();
    if (p.fwd.seqlen_q > 0) {  // with seqlen_q = 0 the Q and dO maps are not even encoded
      tma_prefetch_descriptor(&tma_q);
      tma_prefetch_descriptor(&tma_k);
      tma_prefetch_descriptor(&tma_v);
      tma_prefetch_descriptor(&tma_do);
    }
  }
  __syncthreads();

  // Each role walks the CTA's tiles in a loop of its own, the barriers keeping them in step (one
  // loop around the roles would join their register budgets, 24 and 240, at its back edge: ptxas
  // then spills).
  const int warpgroup = enter_role();
  RingPosition ring;
  auto for_each_tile = [&](auto deferred, auto&& work) {
    KeyTileSequence<Causal, decltype(deferred)::value> walk{p, &bars->tiles};
    for (int linear = walk.first(grid.total()); linear >= 0; linear = walk.next(grid.total())) {
      const KeyTile<Causal, Window, Varlen, TileM, TileN, BlockMask> tile(
          p.fwd, grid.template at<Causal>(linear));
      // Past a shorter sequence's keys. (if constexpr: even a constant-false test changes the
      // dense kernels' code.)
      if constexpr (Varlen)
        if (tile.outside()) continue;
      work(tile);
    }
  };
  if (warpgroup == 0) {
    // Read through a shuffle, the warp is uniform to the compiler: each walk's values then sit
    // in uniform registers (in the producer warpgroup's 24 a thread's walk spilled).
    const int warp = __shfl_sync(0xffffffffu, threadIdx.x / 32, 0);
    if (warp == 0)
      for_each_tile(True{}, [&](const auto& tile) {
        produce<T, HeadDim, TileM, TileN, Stages, Causal, Window, Varlen>(
            p, tile, &tma_q, &tma_k, &tma_v, &tma_do, smem, bars, ring);
      });
    else if (FusedDq && warp == 1) {
      for_each_tile(False{}, [&](const auto& tile) {
        write_dq<HeadDim, TileM, TileN, Stages, Causal, Window, Varlen>(p, tile, smem);
      });
      if (threadIdx.x % 32 == 0) bulk_wait_group<0>();  // the reductions end before the CTA
    } else if (warp == 2 && takes_key_tiles<Causal>(p) && threadIdx.x % 32 == 0) {
      schedule_key_tiles(p, grid.total(), &bars->tiles);
    }
  } else if constexpr (kShape.split_roles() && !FusedDq) {
    const int consumer = warpgroup - 1;
    if (consumer % 2 == 0)
      for_each_tile(False{}, [&](const auto& tile) {
        consume_split<T, HeadDim, TileM, TileN, Stages, Causal, Softcap, Window, Alibi, Varlen,
                      true>(p, tile, smem, bars, consumer / 2, ring);
      });
    else
      for_each_tile(False{}, [&](const auto& tile) {
        consume_split<T, HeadDim, TileM, TileN, Stages, Causal, Softcap, Window, Alibi, Varlen,
                      false>(p, tile, smem, bars, consumer / 2, ring);
      });
  } else {
    for_each_tile(False{}, [&](const auto& tile) {
      consume_keys<T, HeadDim, TileM, TileN, Stages, Causal, Softcap, Window, Alibi, Varlen,
                   FusedDq>(p, tile, smem, bars, warpgroup - 1, ring);
    });
  }
}

}  // namespace flashjit

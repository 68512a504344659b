// bwd_wgmma_dq: dQ of the Hopper backward (sm_90a only), in both modes: with bwd_wgmma's dK and dV
// nothing is added by atomics, so every run gives the same bits.
//
// A CTA owns TileM query rows of one head (grid: query tiles x heads_q x batch, the causal mask's
// longest rows first) and visits their key tiles in order, like the forward (wgmma/kernel.cu)
// without its online softmax: the LSE is known. Warpgroup 0 produces: one thread loads Q and dO
// once and streams K and V through a ring of Stages buffers (TMA, full / empty mbarriers). Each
// consumer warpgroup owns 64 rows:
//   S = Q Kᵀ, dP = dO Vᵀ                              (both operands in shared memory)
//   P = exp2(scale_log2 S - lse_log2), dS = P ∘ (dP - delta)
//   dQ += dS K                                        (dS from registers, K as V in P·V)
// and writes dq = softmax_scale · dQ at the end.
#include "bwd_wgmma/shape.cuh"
#include "bwd_wgmma/warp_roles.cuh"
#include "common/bwd_block_mask.cuh"
#include "common/bwd_scores.cuh"
#include "common/bwd_workspace.cuh"
#include "common/fast_math.cuh"
#include "common/grid_dependency.cuh"
#include "common/masking.cuh"
#include "common/params.cuh"
#include "common/sequence.cuh"
#include "common/sm90_mbarrier.cuh"
#include "common/sm90_store_rows.cuh"
#include "common/sm90_tile_gemm.cuh"
#include "common/sm90_tma.cuh"
#include "common/sm90_warpgroup.cuh"
#include "common/sm90_wgmma.cuh"
#include "common/types.cuh"

namespace flashjit {

template <int Stages>
struct QueryTileBarriers {
  unsigned long long q_full;                       // Q and dO landed (once)
  unsigned long long full[Stages], empty[Stages];  // a key tile's K and V
};

// Where the CTA works: its rows and the key tiles they see (common/masking.cuh; a window's
// band and sink tiles only). Varlen: its sequence's lengths and rows (the grid covers the
// longest sequence; a CTA past a shorter one's rows does nothing).
template <bool Causal, bool Window, bool Varlen, int TileM, int TileN, bool Listed>
struct QueryTile : ListedKeyTiles<Listed> {  // the block-mask entry: the mask's tiles
  int row0, head, kv_head, batch;
  SequenceSpan seq;  // equal-length batches: the launch's lengths, starts 0
  int coord_batch;   // the TMA maps' batch coordinate: 0 for a packed batch
  TileRange keys;

  __device__ __forceinline__ explicit QueryTile(const FmhaParams& f)
      : row0((Causal ? gridDim.x - 1 - blockIdx.x : blockIdx.x) * TileM),
        head(blockIdx.y),
        kv_head(blockIdx.y / f.heads_per_kv),
        batch(blockIdx.z),
        seq(packed_sequence_span<Varlen>(f, blockIdx.z)),
        coord_batch(Varlen ? 0 : blockIdx.z),
        keys(kv_tile_range<Causal, Window, TileM, TileN>(lengths_of<Varlen>(f, seq), f, row0)) {
    if constexpr (Listed) this->find(f, batch, head, row0 / TileM);
  }

  __device__ __forceinline__ bool outside() const { return row0 >= seq.seqlen_q; }
  // The key tiles visited: a block mask's, or those the masks leave.
  __device__ __forceinline__ int key_tiles() const {
    if constexpr (Listed) return this->count_or(keys.count());
    return keys.count();
  }
  __device__ __forceinline__ int key_tile(int j) const {
    if constexpr (Listed) return this->tile_or(j, keys.tile(j));
    return keys.tile(j);
  }
};

// ---- producer ---------------------------------------------------------------------------------

template <typename T, int HeadDim, int TileM, int TileN, int Stages, bool Causal, bool Window,
          bool Varlen, bool Listed>
__device__ __forceinline__ void produce(const QueryTile<Causal, Window, Varlen, TileM, TileN, Listed>& tile,
                                        const TmaDescriptor* tma_q, const TmaDescriptor* tma_k,
                                        const TmaDescriptor* tma_v, const TmaDescriptor* tma_do,
                                        unsigned char* smem, QueryTileBarriers<Stages>* bars) {
  constexpr BwdWgmmaDqShape kShape{HeadDim, TileM, TileN, Stages};
  constexpr int kRow = BwdWgmmaLimits::kRowBytes;
  const int n_tiles = tile.key_tiles();
  if (n_tiles <= 0) return;  // the rows see no key: the consumers write zeros
  mbarrier_arrive_expect_tx(&bars->q_full, 2 * kShape.q_bytes());
#pragma unroll
  for (int b = 0; b < kShape.dim_blocks(); ++b) {
    tma_load_4d(smem + kShape.q_offset() + b * TileM * kRow, tma_q, &bars->q_full, 64 * b,
                tile.seq.q_start + tile.row0, tile.head, tile.coord_batch);
    tma_load_4d(smem + kShape.do_offset() + b * TileM * kRow, tma_do, &bars->q_full, 64 * b,
                tile.seq.q_start + tile.row0, tile.head, tile.coord_batch);
  }
  for (int j = 0; j < n_tiles; ++j) {
    const int stage = j % Stages;
    // Free once every consumer warp is done with tile j - Stages (a fresh barrier passes).
    mbarrier_wait(&bars->empty[stage], ((j / Stages) & 1) ^ 1);
    mbarrier_arrive_expect_tx(&bars->full[stage], 2 * kShape.kv_bytes());
    const int key0 = tile.seq.k_start + tile.key_tile(j) * TileN;
#pragma unroll
    for (int b = 0; b < kShape.dim_blocks(); ++b) {
      tma_load_4d(smem + kShape.k_offset(stage) + b * TileN * kRow, tma_k, &bars->full[stage],
                  64 * b, key0, tile.kv_head, tile.coord_batch);
      tma_load_4d(smem + kShape.v_offset(stage) + b * TileN * kRow, tma_v, &bars->full[stage],
                  64 * b, key0, tile.kv_head, tile.coord_batch);
    }
  }
}

// ---- consumer ---------------------------------------------------------------------------------

template <typename T, int HeadDim, int TileM, int TileN, int Stages, bool Causal, bool Softcap,
          bool Window, bool Alibi, bool Varlen, bool Listed>
__device__ __forceinline__ void consume(const BackwardParams& p,
                                        const QueryTile<Causal, Window, Varlen, TileM, TileN, Listed>& tile,
                                        unsigned char* smem, QueryTileBarriers<Stages>* bars,
                                        int consumer) {
  constexpr BwdWgmmaDqShape kShape{HeadDim, TileM, TileN, Stages};
  constexpr int kRow = BwdWgmmaLimits::kRowBytes;
  const FmhaParams& f = p.fwd;
  const FragmentPosition at;
  const unsigned base = smem_u32(smem);
  const unsigned q_rows = base + kShape.q_offset() + consumer * 64 * kRow;  // this warpgroup's
  const unsigned do_rows = base + kShape.do_offset() + consumer * 64 * kRow;
  const int wg_row0 = tile.row0 + consumer * 64;
  const int lane_row = wg_row0 + at.row;  // the accumulators' rows: + 0, + 8
  using Scores = BackwardScores<Causal, Softcap, Window, Alibi>;
  const Scores scores(f, lengths_of<Varlen>(f, tile.seq), tile.batch, tile.head);
  // The two rows' terms (the workspace's rows are padded to whole tiles: no bounds check).
  const long long terms = BwdWorkspaceRows::first_row<Varlen>(tile.batch, tile.head, f.heads_q,
                                                      p.seqlen_rows, tile.seq.q_start) +
                          lane_row;
  const float lse[2] = {p.lse_log2[terms], p.lse_log2[terms + 8]};
  const float delta[2] = {p.delta[terms], p.delta[terms + 8]};
  float dq[HeadDim / 2];
#pragma unroll
  for (int e = 0; e < HeadDim / 2; ++e) dq[e] = 0.f;

  const int n_tiles = tile.key_tiles();
  if (n_tiles > 0) mbarrier_wait(&bars->q_full, 0);
  for (int j = 0; j < n_tiles; ++j) {
    const int stage = j % Stages;
    mbarrier_wait(&bars->full[stage], (j / Stages) & 1);
    const unsigned k_tile = base + kShape.k_offset(stage), v_tile = base + kShape.v_offset(stage);
    float s[TileN / 2], dp[TileN / 2];
    gemm_ss_tiles<T, HeadDim, TileM, TileN>(s, q_rows, k_tile);
    gemm_ss_tiles<T, HeadDim, TileM, TileN>(dp, do_rows, v_tile);
    // Keys past seqlen_k are zero rows of K and V (or, in a varlen batch, the next sequence's),
    // which would give them P = exp2(-lse_log2): masked with the others, so no overflow there
    // can reach dQ as inf · 0.
    const int key0 = tile.key_tile(j) * TileN;
    const int seqlen_k = lengths_of<Varlen>(f, tile.seq).seqlen_k;
    const bool past_end = key0 + TileN > seqlen_k;
    bool masked = scores.any_masked(wg_row0, wg_row0 + 63, key0, key0 + TileN - 1);
    if constexpr (Listed) masked = tile.masked_or(j, masked);
    // Soft-capped or with a score_mod: dS needs a factor of each score's, so both GEMMs first and
    // one pass over the scores.
    constexpr bool kOnePass = Scores::kPerScoreFactor;
    wgmma_wait<kOnePass ? 0 : 1>();  // S is ready; dP may still run
    wgmma_fence_operands(s);
    if (kOnePass) wgmma_fence_operands(dp);
#pragma unroll
    for (int e = 0; e < TileN / 2; ++e) {
      const int key = key0 + 8 * (e / 4) + at.col + e % 2, h = (e / 2) % 2;
      ScoreDerivative derivative;
      float prob = scores.prob(s[e], lse[h], lane_row + 8 * h, key, masked, derivative);
      if (past_end && key >= seqlen_k) prob = 0.f;
      if constexpr (kOnePass) dp[e] = Scores::gradient(prob, dp[e], delta[h], derivative);
      s[e] = prob;
    }
    if constexpr (!kOnePass) {
      wgmma_wait<0>();
      wgmma_fence_operands(dp);
#pragma unroll
      for (int e = 0; e < TileN / 2; ++e) dp[e] = s[e] * (dp[e] - delta[(e / 2) % 2]);
    }
    unsigned dsf[TileN / 16][4];
    gemm_fragments<T, TileN>(dsf, dp);
    gemm_rs_tiles<T, HeadDim, TileN>(dq, dsf, k_tile);
    wgmma_wait<0>();
    wgmma_fence_operands(dq);
    wgmma_fence_operands(dsf);  // its registers stay reserved until the GEMM reading them is done
    release_stage(&bars->empty[stage]);
  }

  T* rows;
  if constexpr (Varlen)
    rows = static_cast<T*>(p.dq) + tile.seq.q_start * p.dq_stride_s + tile.head * p.dq_stride_h;
  else
    rows = static_cast<T*>(p.dq) + tile.batch * p.dq_stride_b + tile.head * p.dq_stride_h;
  store_accumulator_rows<T, HeadDim>(rows, p.dq_stride_s, wg_row0,
                                     lengths_of<Varlen>(f, tile.seq).seqlen_q, dq, p.dscore_scale);
}

// ---- kernel -----------------------------------------------------------------------------------

// BlockMask: the entry that reads a block mask (FmhaParams::block_*), compiled beside the other
// for variants with a mask_mod.
template <typename T, int HeadDim, int TileM, int TileN, int Stages, bool Causal, bool Softcap,
          bool Window, bool Alibi, bool Varlen, bool BlockMask = false>
__global__ void __launch_bounds__(BwdWgmmaDqShape{HeadDim, TileM, TileN, Stages}.threads(), 1)
    bwd_wgmma_dq_kernel(const BackwardParams p, const __grid_constant__ TmaDescriptor tma_q,
                        const __grid_constant__ TmaDescriptor tma_k,
                        const __grid_constant__ TmaDescriptor tma_v,
                        const __grid_constant__ TmaDescriptor tma_do) {
  begin_after_previous_grid();
  constexpr BwdWgmmaDqShape kShape{HeadDim, TileM, TileN, Stages};
  static_assert(HeadDim % 64 == 0 && TileM % 64 == 0 && TileN % 16 == 0, "whole swizzled tiles");
  static_assert(TileM <= BwdWgmmaLimits::kMaxBoxRows && TileN <= BwdWgmmaLimits::kMaxBoxRows,
                "one TMA box per column block");
  static_assert(kShape.consumers() >= 1 && kShape.consumers() <= BwdWgmmaLimits::kMaxConsumers,
                "one or two consumer warpgroups");
  static_assert(kShape.shared_bytes() <= BwdWgmmaLimits::kMaxSharedBytes, "fits shared memory");
  static_assert(sizeof(QueryTileBarriers<Stages>) == kShape.barrier_bytes(), "barrier bytes");
  static_assert(!BlockMask || user::kMaskMod, "block masks come with a mask_mod");
  extern __shared__ unsigned char smem_raw[];
  unsigned char* smem = aligned_tiles(smem_raw);
  auto* bars = reinterpret_cast<QueryTileBarriers<Stages>*>(smem + kShape.barrier_offset());
  const QueryTile<Causal, Window, Varlen, TileM, TileN, BlockMask> tile(p.fwd);
  // The whole CTA: past a shorter sequence's rows. (if constexpr: even a constant-false test
  // changes the dense kernels' code.)
  if constexpr (Varlen)
    if (tile.outside()) return;

  if (threadIdx.x == 0) {
    mbarrier_init(&bars->q_full, 1);
    for (int s = 0; s < Stages; ++s) {
      mbarrier_init(&bars->full[s], 1);
      mbarrier_init(&bars->empty[s], kShape.consumer_warps());
    }
    mbarrier_init_fence();
    tma_prefetch_descriptor(&tma_q);
    tma_prefetch_descriptor(&tma_k);
    tma_prefetch_descriptor(&tma_v);
    tma_prefetch_descriptor(&tma_do);
  }
  __syncthreads();

  const int warpgroup = enter_role();
  if (warpgroup == 0) {
    if (threadIdx.x == 0)
      produce<T, HeadDim, TileM, TileN, Stages, Causal, Window, Varlen>(
          tile, &tma_q, &tma_k, &tma_v, &tma_do, smem, bars);
  } else {
    consume<T, HeadDim, TileM, TileN, Stages, Causal, Softcap, Window, Alibi, Varlen>(
        p, tile, smem, bars, warpgroup - 1);
  }
}

}  // namespace flashjit

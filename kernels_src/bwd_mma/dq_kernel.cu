// bwd_mma_dq: dQ alone on mma.sync, for the deterministic backward (BackwardOptions::
// deterministic): a CTA owns TileM query rows of one head (16 per warp, as the forward's mma
// kernel) and visits their key tiles in order, summing dQ in registers, so no atomics and the
// same bits every run. It recomputes what bwd_mma computes key-major:
//   S = Q Kᵀ, P = exp2(scale_log2 S - lse_log2), dP = dO Vᵀ, dS = P ∘ (dP - delta), dQ += dS K
// K and V stream through `Stages` buffers by cp.async, one group per key tile.
#include "bwd_mma/shape.cuh"
#include "common/bwd_block_mask.cuh"
#include "common/bwd_scores.cuh"
#include "common/bwd_workspace.cuh"
#include "common/fast_math.cuh"
#include "common/grid_dependency.cuh"
#include "common/masking.cuh"
#include "common/mma_attention.cuh"
#include "common/mma_sm80.cuh"
#include "common/params.cuh"
#include "common/sequence.cuh"
#include "common/tile_copy_async.cuh"
#include "common/types.cuh"

namespace flashjit {

// BlockMask: the entry that reads a block mask (FmhaParams::block_*), compiled beside the other
// for variants with a mask_mod.
template <typename T, int HeadDim, int TileM, int TileN, int Stages, bool Causal, bool Softcap,
          bool Window, bool Alibi, bool Varlen, bool BlockMask = false>
__global__ void __launch_bounds__(BwdMmaDqShape{HeadDim, TileM, TileN, Stages}.threads())
    bwd_mma_dq_kernel(const BackwardParams p) {
  begin_after_previous_grid();
  constexpr BwdMmaDqShape kShape{HeadDim, TileM, TileN, Stages};
  constexpr int kThreads = kShape.threads();
  static_assert(!BlockMask || user::kMaskMod, "block masks come with a mask_mod");
  constexpr int kPitch = kShape.pitch();
  constexpr int NT = TileN / 8;   // n8 key tiles of S
  constexpr int DT = HeadDim / 8;  // n8 dim tiles of dQ
  static_assert(TileN % 16 == 0 && HeadDim % 16 == 0, "whole mma tiles");

  extern __shared__ __align__(16) unsigned char smem[];
  const FmhaParams& f = p.fwd;
  const int m_tile = Causal ? gridDim.x - 1 - blockIdx.x : blockIdx.x;  // longest rows first
  const int head = blockIdx.y, batch = blockIdx.z, kv_head = head / f.heads_per_kv;
  const int row0 = m_tile * TileM, lane = threadIdx.x % 32, warp_row0 = threadIdx.x / 32 * 16;
  const unsigned base = smem_address(smem);
  // Varlen: the sequence's lengths and rows (the grid covers the longest sequence); the copies
  // zero-fill past its ends, as past a dense tensor's.
  const SequenceSpan seq = packed_sequence_span<Varlen>(f, batch);
  if constexpr (Varlen)  // (if constexpr: a constant-false test still changes dense code)
    if (row0 >= seq.seqlen_q) return;  // past a shorter sequence's rows
  const long long q_row0 = seq.q_start, k_row0 = seq.k_start;

  TileStream<T, HeadDim, TileM, kPitch, kThreads>(
      static_cast<const T*>(f.q) + seq.q_batch * f.q_stride_b + q_row0 * f.q_stride_s +
          head * f.q_stride_h,
      f.q_stride_s)
      .copy(base, row0, seq.seqlen_q, f.q_stride_s);
  TileStream<T, HeadDim, TileM, kPitch, kThreads>(
      static_cast<const T*>(p.dout) + seq.q_batch * p.do_stride_b + q_row0 * p.do_stride_s +
          head * p.do_stride_h,
      p.do_stride_s)
      .copy(base + kShape.q_bytes(), row0, seq.seqlen_q, p.do_stride_s);
  using KvStream = TileStream<T, HeadDim, TileN, kPitch, kThreads>;
  const KvStream k_stream(static_cast<const T*>(f.k) + seq.k_batch * f.k_stride_b +
                              k_row0 * f.k_stride_s + kv_head * f.k_stride_h,
                          f.k_stride_s);
  const KvStream v_stream(static_cast<const T*>(f.v) + seq.k_batch * f.v_stride_b +
                              k_row0 * f.v_stride_s + kv_head * f.v_stride_h,
                          f.v_stride_s);
  const TileRange range = kv_tile_range<Causal, Window, TileM, TileN>(seq, f, row0);
  ListedKeyTiles<BlockMask> listed;
  if constexpr (BlockMask) listed.find(f, batch, head, m_tile);
  const int n_tiles = listed.count_or(range.count());
  auto key_tile = [&](int j) {
    if constexpr (BlockMask) return listed.tile_or(j, range.tile(j));
    return range.tile(j);
  };
  auto load_tile = [&](int j) {  // key tile j into buffer j % Stages
    k_stream.copy(base + kShape.k_offset(j % Stages), key_tile(j) * TileN, seq.seqlen_k,
                  f.k_stride_s);
    v_stream.copy(base + kShape.v_offset(j % Stages), key_tile(j) * TileN, seq.seqlen_k,
                  f.v_stride_s);
  };
  // Groups: Q and dO with tile 0, then one per tile up to Stages - 1 ahead (empty past the end).
#pragma unroll
  for (int j = 0; j < Stages - 1; ++j) {
    if (j < n_tiles) load_tile(j);
    cp_async_commit();
  }
  if (Stages == 1) {
    if (n_tiles > 0) load_tile(0);
    cp_async_commit();
  }

  // The lane's two rows' terms (the workspace's rows are padded: no bounds check).
  const long long terms = BwdWorkspaceRows::first_row<Varlen>(batch, head, f.heads_q,
                                                      p.seqlen_rows, seq.q_start) +
                          row0 + warp_row0 + lane / 4;
  const float lse[2] = {p.lse_log2[terms], p.lse_log2[terms + 8]};
  const float delta[2] = {p.delta[terms], p.delta[terms + 8]};
  const int lane_row = row0 + warp_row0 + lane / 4;
  const BackwardScores<Causal, Softcap, Window, Alibi> scores(f, seq.lengths(), batch, head);

  const unsigned q_addr = base + ((warp_row0 + lane % 16) * kPitch + (lane / 16) * 8) * 2;
  const unsigned do_addr = q_addr + kShape.q_bytes();
  const unsigned kv_rows = ((lane % 8 + (lane / 16) * 8) * kPitch + ((lane / 8) % 2) * 8) * 2;
  const unsigned kv_cols = ((lane % 8 + ((lane / 8) % 2) * 8) * kPitch + (lane / 16) * 8) * 2;

  float dq[1][DT][4];
#pragma unroll
  for (int dt = 0; dt < DT; ++dt)
#pragma unroll
    for (int e = 0; e < 4; ++e) dq[0][dt][e] = 0.f;

  for (int j = 0; j < n_tiles; ++j) {
    if (Stages == 1 && j > 0) {
      __syncthreads();  // every warp is done with tile j - 1
      load_tile(j);
      cp_async_commit();
    }
    cp_async_wait<Stages == 1 ? 0 : Stages - 2>();
    __syncthreads();  // tile j has landed for all; every warp is done with tile j - 1's buffer
    if (Stages > 1) {
      if (j + Stages - 1 < n_tiles) load_tile(j + Stages - 1);
      cp_async_commit();
    }
    const unsigned k_tile = base + kShape.k_offset(j % Stages);
    const unsigned v_tile = base + kShape.v_offset(j % Stages);
    float s[1][NT][4], dp[1][NT][4];
    gemm_qk<T, HeadDim, 1, NT, kPitch>(s, q_addr, k_tile + kv_rows);
    gemm_qk<T, HeadDim, 1, NT, kPitch>(dp, do_addr, v_tile + kv_rows);
    // Keys past seqlen_k are zero rows of K and V: their dS meets a zero row of K in dQ.
    const int key0 = key_tile(j) * TileN;
    bool masked =
        scores.any_masked(row0 + warp_row0, row0 + warp_row0 + 15, key0, key0 + TileN - 1);
    if constexpr (BlockMask) masked = listed.masked_or(j, masked);
    unsigned ds[1][NT / 2][4];
#pragma unroll
    for (int nt = 0; nt < NT; ++nt)
#pragma unroll
      for (int h = 0; h < 2; ++h) {
        float d[2];
#pragma unroll
        for (int e = 0; e < 2; ++e) {
          const int key = key0 + nt * 8 + (lane % 4) * 2 + e;
          ScoreDerivative derivative;
          const float prob =
              scores.prob(s[0][nt][2 * h + e], lse[h], lane_row + h * 8, key, masked, derivative);
          d[e] = decltype(scores)::gradient(prob, dp[0][nt][2 * h + e], delta[h], derivative);
        }
        ds[0][nt / 2][(nt % 2) * 2 + h] = pack2<T>(d[0], d[1]);
      }
    gemm_pv<T, 1, NT, DT, kPitch>(dq, ds, k_tile + kv_cols);
  }
  cp_async_wait<0>();

  T* out = static_cast<T*>(p.dq) + seq.q_batch * p.dq_stride_b + q_row0 * p.dq_stride_s +
           head * p.dq_stride_h;
  const float scale = p.dscore_scale;
#pragma unroll
  for (int h = 0; h < 2; ++h) {
    const int row = lane_row + h * 8;
    if (row >= seq.seqlen_q) continue;
#pragma unroll
    for (int dt = 0; dt < DT; ++dt)
      *reinterpret_cast<unsigned*>(out + row * p.dq_stride_s + dt * 8 + (lane % 4) * 2) =
          pack2<T>(dq[0][dt][2 * h] * scale, dq[0][dt][2 * h + 1] * scale);
  }
}

}  // namespace flashjit

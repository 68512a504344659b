// bwd_mma: FlashAttention-2's backward on tensor cores (mma.sync m16n8k16, fp32 accumulation),
// for every GPU from sm_80 on: dK and dV, and dQ by fp32 atomics (the default mode).
//
// A CTA owns TileN keys of one KV head (grid: key tiles x heads_kv x batch) and walks the query
// rows that see them, TileM a step, for every query head of its GQA group, so dK and dV are
// summed over the group in registers and written once, with no atomics. Per step, with the
// queries as columns (each warp holds 16 keys as the rows of its accumulators):
//   Sᵀ = K Qᵀ, Pᵀ = exp2(scale_log2 Sᵀ - lse_log2)   (the forward's probabilities, from its LSE)
//   dV += Pᵀ dO,  dPᵀ = V dOᵀ,  dSᵀ = Pᵀ ∘ (dPᵀ - delta),  dK += dSᵀ Q
//   dQ += dS K    (dSᵀ through shared memory; every key tile adds into the fp32 accumulator)
// The accumulator layout of two n8 tiles of Pᵀ or dSᵀ is the A-operand layout of one k16 step,
// so those GEMMs take them straight from registers. Q, dO and the row terms (bwd_rows/kernel.cu's
// delta and lse_log2) stream through `Stages` buffers by cp.async; rows are padded by 16 bytes
// (no bank conflicts in ldmatrix, as in mma/kernel.cu).
#include "bwd_mma/shape.cuh"
#include "common/bwd_block_mask.cuh"
#include "common/bwd_scores.cuh"
#include "common/bwd_workspace.cuh"
#include "common/fast_math.cuh"
#include "common/grid_dependency.cuh"
#include "common/mma_attention.cuh"
#include "common/mma_sm80.cuh"
#include "common/params.cuh"
#include "common/sequence.cuh"
#include "common/sm90_tma.cuh"
#include "common/tile_copy_async.cuh"
#include "common/types.cuh"

namespace flashjit {

// This lane's ldmatrix address in a padded tile (rows of Pitch elements) for the three operand
// roles the backward GEMMs use, at row 0, column col0:
//  - a_rows: an A operand whose rows are the tile's rows (16 of them from row0);
//  - b_rows: a B operand whose n index runs along the tile's rows (as K in S = Q Kᵀ);
//  - b_cols: a B operand whose k index runs along the tile's rows (as V in O = P V), .trans.
template <int Pitch>
__device__ __forceinline__ unsigned a_rows(unsigned tile, int lane, int row0, int col0) {
  return tile + ((row0 + lane % 16) * Pitch + (lane / 16) * 8 + col0) * 2;
}
template <int Pitch>
__device__ __forceinline__ unsigned b_rows(unsigned tile, int lane, int col0) {
  return tile + ((lane % 8 + (lane / 16) * 8) * Pitch + ((lane / 8) % 2) * 8 + col0) * 2;
}
template <int Pitch>
__device__ __forceinline__ unsigned b_cols(unsigned tile, int lane, int col0) {
  return tile + ((lane % 8 + ((lane / 8) % 2) * 8) * Pitch + (lane / 16) * 8 + col0) * 2;
}

// acc = A Bᵀ over Dims columns: A's 16 rows from a_addr, B's NQ·8 rows from b_addr (a_rows /
// b_rows addresses).
template <typename T, int Dims, int NQ, int Pitch>
__device__ __forceinline__ void gemm_rows(float (&acc)[1][NQ][4], unsigned a_addr,
                                          unsigned b_addr) {
  gemm_qk_at<T, Dims, 1, NQ>(
      acc, [&](int, int kk) { return a_addr + kk * 32; },
      [&](int np, int kk) { return b_addr + (np * 16 * Pitch + kk * 16) * 2; });
}

// acc += P B, P in registers (A layout, NQ/2 k16 steps), B rows from b_addr (a b_cols address).
template <typename T, int NQ, int DT, int Pitch>
__device__ __forceinline__ void gemm_cols(float (&acc)[1][DT][4],
                                          const unsigned (&pr)[1][NQ / 2][4], unsigned b_addr) {
  gemm_pv_at<T, 1, NQ, DT>(acc, pr,
                           [&](int kk, int dp) { return b_addr + (kk * 16 * Pitch + dp * 16) * 2; });
}

// The accumulator of NQ n8 tiles, rounded to T, in A-operand order.
template <typename T, int NQ>
__device__ __forceinline__ void to_a_operand(unsigned (&packed)[1][NQ / 2][4],
                                             const float (&x)[1][NQ][4]) {
#pragma unroll
  for (int nt = 0; nt < NQ; ++nt)
#pragma unroll
    for (int h = 0; h < 2; ++h)
      packed[0][nt / 2][(nt % 2) * 2 + h] = pack2<T>(x[0][nt][2 * h], x[0][nt][2 * h + 1]);
}

// BlockMask: the entry that reads a block mask (FmhaParams::block_*), compiled beside the other
// for variants with a mask_mod.
template <typename T, int HeadDim, int TileM, int TileN, int Stages, bool Causal, bool Softcap,
          bool Window, bool Alibi, bool Varlen, bool BlockMask = false>
__global__ void __launch_bounds__(BwdMmaShape{HeadDim, TileM, TileN, Stages, false}.threads())
    bwd_mma_kernel(const BackwardParams p) {
  begin_after_previous_grid();
  constexpr BwdMmaShape kShape{HeadDim, TileM, TileN, Stages, bulk_dq_reduce(__CUDA_ARCH__ / 10)};
  constexpr int kThreads = kShape.threads();
  static_assert(!BlockMask || user::kMaskMod, "block masks come with a mask_mod");
  constexpr int kPitch = kShape.pitch();
  constexpr int kWarpDims = kShape.warp_dims();
  constexpr int kKeyWarps = kShape.key_warps();
  constexpr int NQ = TileM / 8;      // n8 query tiles of Sᵀ
  // A step's query rows in parts (the loop over them says why) where one part spilled: 58 of
  // 1536 variants (8-52 B, sm_80 and sm_90a), all with a score variant at 128 rows, or with a
  // window at 64. Two parts cost where nothing spilled (H100, session 44): plain 3-5 %, d128
  // softcap / ALiBi 2 %; at d64 with a score variant they are even (ALiBi 1 % faster).
  constexpr bool kScoreVariant =
      Softcap || Window || Alibi || BackwardScores<Causal, Softcap, Window, Alibi>::kUser;
  constexpr int kParts = (TileM >= 128 && kScoreVariant) || (TileM >= 64 && Window) ? 2 : 1;
  constexpr int kPartRows = TileM / kParts;
  constexpr int NP = NQ / kParts;  // n8 query tiles of a part
  constexpr int DT = kWarpDims / 8;  // n8 dim tiles of the warp's dK and dV
  constexpr int kDqDims = kShape.dq_dims();
  static_assert(TileN % 16 == 0 && TileM % 16 == 0 && kWarpDims % 16 == 0, "whole mma tiles");
  static_assert(kShape.warps() % (TileM / 16) == 0 && kDqDims % 16 == 0, "whole dQ parts");
  static_assert(kThreads >= TileM / 2, "one 16-byte row-term vector per thread");
  static_assert(Stages == 1 || Stages == 2, "one or two Q/dO buffers");

  extern __shared__ __align__(16) unsigned char smem[];
  const FmhaParams& f = p.fwd;
  const int key0 = blockIdx.x * TileN, kv_head = blockIdx.y, batch = blockIdx.z;
  const int lane = threadIdx.x % 32, warp = threadIdx.x / 32;
  const int key_warp = warp % kKeyWarps, dim0 = warp / kKeyWarps * kWarpDims;
  const unsigned base = smem_address(smem);
  // Varlen: the sequence's lengths and rows (the grid covers the longest sequence); the copies
  // zero-fill past its ends, as past a dense tensor's. Read from shared memory where used: the
  // d128 kernel has no register to hold them through the loop.
  __shared__ SequenceSpan shared_seq;
  __shared__ long long shared_terms;  // the sequence's first workspace row of head 0
  auto sequence = [&]() { return Varlen ? shared_seq : packed_sequence_span<false>(f, batch); };
  if constexpr (Varlen) {  // (if constexpr: a constant-false test still changes dense code)
    if (threadIdx.x == 0) {
      shared_seq = packed_sequence_span<Varlen>(f, batch);
      shared_terms = BwdWorkspaceRows::first_row<true>(batch, 0, f.heads_q, p.seqlen_rows,
                                                       shared_seq.q_start);
    }
    __syncthreads();
    if (key0 >= sequence().seqlen_k) return;  // past a shorter sequence's keys
  }
  // Where the tile's KV head of the sequence starts in a [batch, keys, heads_kv, d] tensor (a
  // packed batch's is its only batch).
  auto kv_rows = [&](const void* t, long long stride_b, long long stride_s, long long stride_h) {
    if constexpr (Varlen)
      return static_cast<const T*>(t) + sequence().k_start * stride_s + kv_head * stride_h;
    else
      return static_cast<const T*>(t) + batch * stride_b + kv_head * stride_h;
  };
  // The same for query head `head` in a [batch, queries, heads_q, d] tensor.
  auto q_rows = [&](const void* t, long long stride_b, long long stride_s, long long stride_h,
                    int head) {
    if constexpr (Varlen)
      return static_cast<const T*>(t) + sequence().q_start * stride_s + head * stride_h;
    else
      return static_cast<const T*>(t) + batch * stride_b + head * stride_h;
  };

  TileStream<T, HeadDim, TileN, kPitch, kThreads>(
      kv_rows(f.k, f.k_stride_b, f.k_stride_s, f.k_stride_h), f.k_stride_s)
      .copy(base + kShape.k_offset(), key0, sequence().seqlen_k, f.k_stride_s);
  TileStream<T, HeadDim, TileN, kPitch, kThreads>(
      kv_rows(f.v, f.v_stride_b, f.v_stride_s, f.v_stride_h), f.v_stride_s)
      .copy(base + kShape.v_offset(), key0, sequence().seqlen_k, f.v_stride_s);

  // The rows that see a key of this tile (causal: from the first whose diagonal reaches key0; a
  // window: up to the last its left side reaches), for each head of the group: step t is head
  // t / m_tiles, query tile m_first + t % m_tiles. In the block-mask entry
  // (common/bwd_block_mask.cuh): the mask's list of them for this key tile.
  const QueryTilesSeeing<Causal, Window, TileM> seeing(f, sequence().lengths(), key0,
                                                       key0 + TileN - 1);
  const int m_first = seeing.first, m_tiles = seeing.count;
  ListedSteps<BlockMask> listed;
  int steps = m_tiles * f.heads_per_kv;
  if constexpr (BlockMask) {
    listed.find(f, batch, kv_head, blockIdx.x);
    steps = listed.count_or(steps);
  }
  auto step_head = [&](int t) {
    if constexpr (BlockMask)
      return kv_head * f.heads_per_kv + listed.head_offset_or(t, t / m_tiles);
    return kv_head * f.heads_per_kv + t / m_tiles;
  };
  auto step_row0 = [&](int t) {
    if constexpr (BlockMask) return listed.tile_or(t, m_first + t % m_tiles) * TileM;
    return (m_first + t % m_tiles) * TileM;
  };
  auto row_terms = [&](int t) {  // first workspace row of step t
    if constexpr (Varlen)
      return shared_terms + static_cast<long long>(step_head(t)) * p.seqlen_rows + step_row0(t);
    else
      return BwdWorkspaceRows::first_row<false>(batch, step_head(t), f.heads_q, p.seqlen_rows, 0) +
             step_row0(t);
  };
  auto load_step = [&](int t, int stage) {
    const int head = step_head(t), row0 = step_row0(t);
    const int seqlen_q = sequence().seqlen_q;
    TileStream<T, HeadDim, TileM, kPitch, kThreads>(
        q_rows(f.q, f.q_stride_b, f.q_stride_s, f.q_stride_h, head), f.q_stride_s)
        .copy(base + kShape.q_offset(stage), row0, seqlen_q, f.q_stride_s);
    TileStream<T, HeadDim, TileM, kPitch, kThreads>(
        q_rows(p.dout, p.do_stride_b, p.do_stride_s, p.do_stride_h, head), p.do_stride_s)
        .copy(base + kShape.do_offset(stage), row0, seqlen_q, p.do_stride_s);
    // lse_log2 then delta, TileM floats each: the workspace's rows are padded to whole tiles.
    const int i = threadIdx.x;
    if (i < TileM / 2) {
      const bool lse = i < TileM / 4;
      const float* from = (lse ? p.lse_log2 : p.delta) + row_terms(t) + 4 * (lse ? i : i - TileM / 4);
      cp_async_16(base + kShape.rows_offset(stage) + 16 * i, from, true);
    }
  };
  if (steps > 0) load_step(0, 0);
  cp_async_commit();

  float dk[1][DT][4], dv[1][DT][4];
#pragma unroll
  for (int dt = 0; dt < DT; ++dt)
#pragma unroll
    for (int e = 0; e < 4; ++e) dk[0][dt][e] = dv[0][dt][e] = 0.f;
  const int lane_key = key0 + key_warp * 16 + lane / 4;  // rows of the lane's accumulators: +0, +8

  for (int t = 0; t < steps; ++t) {
    const int stage = Stages == 1 ? 0 : t % 2;
    // Step t - 1's dQ staging tile must be read out before any barrier lets it be overwritten.
    if (kShape.bulk_dq && threadIdx.x == 0) bulk_wait_group_read<0>();
    if (Stages == 1 && t > 0) {
      __syncthreads();  // every warp is done with step t - 1's buffers
      load_step(t, 0);
      cp_async_commit();
    }
    cp_async_wait<0>();
    __syncthreads();  // step t has landed for all; every warp is done with step t - 1
    if (Stages == 2 && t + 1 < steps) load_step(t + 1, (t + 1) % 2);
    cp_async_commit();
    const int row0 = step_row0(t);
    const unsigned q_tile = base + kShape.q_offset(stage), do_tile = base + kShape.do_offset(stage);
    // dSᵀ of the query rows from part_row0 (a part's packed) to shared memory, one warp of each
    // key row, for dQ below.
    unsigned packed[1][NP / 2][4];
    const auto store_ds = [&](int part_row0) {
      if (dim0 != 0) return;
#pragma unroll
      for (int nt = 0; nt < NP; ++nt)
#pragma unroll
        for (int h = 0; h < 2; ++h)
          *reinterpret_cast<unsigned*>(
              smem + kShape.ds_offset() +
              ((key_warp * 16 + lane / 4 + h * 8) * kShape.ds_pitch() + part_row0 + nt * 8 +
               (lane % 4) * 2) * 2) = packed[0][nt / 2][(nt % 2) * 2 + h];
    };
    // The step's query rows go kPartRows at a time: only one part's Sᵀ and dPᵀ are live beside
    // dK and dV. dV's and dK's k16 steps still run in row order, so the sums keep their bits.
#pragma unroll
    for (int part = 0; part < kParts; ++part) {
      const int part_row0 = part * kPartRows;  // within the step
      const unsigned part_bytes = part_row0 * kPitch * 2;
      float s[1][NP][4], dp[1][NP][4];
      gemm_rows<T, kWarpDims, NP, kPitch>(s, a_rows<kPitch>(base + kShape.k_offset(), lane,
                                                            key_warp * 16, dim0),
                                          b_rows<kPitch>(q_tile + part_bytes, lane, dim0));
      gemm_rows<T, kWarpDims, NP, kPitch>(dp, a_rows<kPitch>(base + kShape.v_offset(), lane,
                                                             key_warp * 16, dim0),
                                          b_rows<kPitch>(do_tile + part_bytes, lane, dim0));
      if constexpr (kShape.dim_split() > 1) {
        // Each warp of a key row summed its columns of the head dim: add the partner's partial
        // Sᵀ and dPᵀ (one partner at dim split 2; a + b is b + a, so both get the same bits).
        // Each part has its own slots, so no part overwrites what the partner still reads.
        float* mine = reinterpret_cast<float*>(smem + kShape.partial_offset()) +
                      warp * 2 * 4 * NQ * 32;
        float* theirs = reinterpret_cast<float*>(smem + kShape.partial_offset()) +
                        (warp ^ kKeyWarps) * 2 * 4 * NQ * 32;
        static_assert(kShape.dim_split() == 2, "one partner");
#pragma unroll
        for (int nt = 0; nt < NP; ++nt)
#pragma unroll
          for (int e = 0; e < 4; ++e) {
            mine[((part * NP + nt) * 4 + e) * 32 + lane] = s[0][nt][e];
            mine[((NQ + part * NP + nt) * 4 + e) * 32 + lane] = dp[0][nt][e];
          }
        __syncthreads();
#pragma unroll
        for (int nt = 0; nt < NP; ++nt)
#pragma unroll
          for (int e = 0; e < 4; ++e) {
            s[0][nt][e] += theirs[((part * NP + nt) * 4 + e) * 32 + lane];
            dp[0][nt][e] += theirs[((NQ + part * NP + nt) * 4 + e) * 32 + lane];
          }
      }

      // Pᵀ and dSᵀ in place of Sᵀ and dPᵀ. Keys past seqlen_k are zero-filled rows of K and V:
      // their probabilities reach only dK and dV rows that are never stored, and dQ through a
      // zero row of K, so only the causal and window masks apply.
      const float* terms = reinterpret_cast<const float*>(smem + kShape.rows_offset(stage));
      const BackwardScores<Causal, Softcap, Window, Alibi> scores(f, sequence().lengths(), batch,
                                                                  step_head(t));
      bool masked = scores.any_masked(row0 + part_row0, row0 + part_row0 + kPartRows - 1, key0,
                                      key0 + TileN - 1);
      if constexpr (BlockMask) masked = listed.masked_or(t, masked);
#pragma unroll
      for (int nt = 0; nt < NP; ++nt) {
        const int col = part_row0 + nt * 8 + (lane % 4) * 2;
        const float2 lse = *reinterpret_cast<const float2*>(terms + col);
        const float2 delta = *reinterpret_cast<const float2*>(terms + TileM + col);
#pragma unroll
        for (int e = 0; e < 4; ++e) {
          const int key = lane_key + (e / 2) * 8, row = row0 + col + e % 2;
          ScoreDerivative derivative;
          const float prob =
              scores.prob(s[0][nt][e], e % 2 ? lse.y : lse.x, row, key, masked, derivative);
          s[0][nt][e] = prob;
          dp[0][nt][e] = decltype(scores)::gradient(prob, dp[0][nt][e], e % 2 ? delta.y : delta.x,
                                                    derivative);
        }
      }
      to_a_operand<T, NP>(packed, s);
      gemm_cols<T, NP, DT, kPitch>(dv, packed, b_cols<kPitch>(do_tile + part_bytes, lane, dim0));
      to_a_operand<T, NP>(packed, dp);
      gemm_cols<T, NP, DT, kPitch>(dk, packed, b_cols<kPitch>(q_tile + part_bytes, lane, dim0));
      // The next part replaces packed. In one part the store waits for the test below (the
      // code ptxas was given before parts, which spilled less).
      if (kParts > 1 && p.dq_accum != nullptr) store_ds(part_row0);
    }

    if (p.dq_accum == nullptr) continue;  // deterministic: bwd_mma_dq computes dQ
    if (kParts == 1) store_ds(0);
    // dQ = dS K over every warp (dSᵀ as written above): m16 row tile dq_row0, columns dq_col0 +
    // [0, kDqDims), added into the fp32 accumulator.
    const unsigned ds_tile = base + kShape.ds_offset();
    __syncthreads();
    const int dq_row0 = warp % (TileM / 16) * 16, dq_col0 = warp / (TileM / 16) * kDqDims;
    unsigned ds[1][TileN / 16][4];  // dS's 16 rows x TileN keys in A order: ldmatrix.trans of dSᵀ
#pragma unroll
    for (int kk = 0; kk < TileN / 16; ++kk)
      ldmatrix_x4_trans(ds[0][kk], ds_tile + ((kk * 16 + lane % 8 + (lane / 16) * 8) *
                                                  kShape.ds_pitch() +
                                              dq_row0 + ((lane / 8) % 2) * 8) * 2);
    float dq[1][kDqDims / 8][4];
#pragma unroll
    for (int dt = 0; dt < kDqDims / 8; ++dt)
#pragma unroll
      for (int e = 0; e < 4; ++e) dq[0][dt][e] = 0.f;
    gemm_cols<T, TileN / 8, kDqDims / 8, kPitch>(dq, ds,
                                                 b_cols<kPitch>(base + kShape.k_offset(), lane, dq_col0));
    if constexpr (kShape.bulk_dq) {
      float* staged = reinterpret_cast<float*>(smem + kShape.dq_stage_offset()) +
                      (dq_row0 + lane / 4) * HeadDim + dq_col0 + (lane % 4) * 2;
#pragma unroll
      for (int dt = 0; dt < kDqDims / 8; ++dt)
#pragma unroll
        for (int h = 0; h < 2; ++h)
          *reinterpret_cast<float2*>(staged + h * 8 * HeadDim + dt * 8) =
              make_float2(dq[0][dt][2 * h], dq[0][dt][2 * h + 1]);
      fence_proxy_async_shared();
      __syncthreads();  // the whole tile is staged
      if (threadIdx.x == 0) {
        bulk_reduce_add_f32(p.dq_accum + row_terms(t) * HeadDim,
                            base + kShape.dq_stage_offset(), kShape.dq_stage_bytes());
        bulk_commit_group();
      }
    } else {
      float* accumulator = p.dq_accum + (row_terms(t) + dq_row0 + lane / 4) * HeadDim +
                           dq_col0 + (lane % 4) * 2;
#pragma unroll
      for (int dt = 0; dt < kDqDims / 8; ++dt)
#pragma unroll
        for (int e = 0; e < 4; ++e)
          atomicAdd(accumulator + (e / 2) * 8 * HeadDim + dt * 8 + e % 2, dq[0][dt][e]);
    }
  }
  cp_async_wait<0>();
  if (kShape.bulk_dq && threadIdx.x == 0) bulk_wait_group<0>();  // its adds are done

  // dK = softmax_scale · dSᵀ Q (S was scale · q·k), dV as summed; keys past seqlen_k not stored.
  T* dk_out = const_cast<T*>(kv_rows(p.dk, p.dk_stride_b, p.dk_stride_s, p.dk_stride_h));
  T* dv_out = const_cast<T*>(kv_rows(p.dv, p.dv_stride_b, p.dv_stride_s, p.dv_stride_h));
  const int seqlen_k = sequence().seqlen_k;
  const float scale = p.dscore_scale;
#pragma unroll
  for (int h = 0; h < 2; ++h) {
    const int key = lane_key + h * 8;
    if (key >= seqlen_k) continue;
#pragma unroll
    for (int dt = 0; dt < DT; ++dt) {
      const int col = dim0 + dt * 8 + (lane % 4) * 2;
      *reinterpret_cast<unsigned*>(dk_out + key * p.dk_stride_s + col) =
          pack2<T>(dk[0][dt][2 * h] * scale, dk[0][dt][2 * h + 1] * scale);
      *reinterpret_cast<unsigned*>(dv_out + key * p.dv_stride_s + col) =
          pack2<T>(dv[0][dt][2 * h], dv[0][dt][2 * h + 1]);
    }
  }
}

}  // namespace flashjit

// fmha_mma: FlashAttention-2 forward on tensor cores (mma.sync m16n8k16, fp32 accumulation), for
// every GPU from sm_80 on.
//
// Layout of the work: one CTA per (TileM query rows, head, batch), 4 warps. Varlen (varlen batches,
// seqused_k): each sequence's own rows and lengths (common/sequence.cuh); the grid covers the
// longest sequence, and CTAs past a shorter one's queries return. Paged: K and V rows come
// through the page table (PagedTileStream), a lookup per row copied. Each warp owns TileM/4
// query rows (one or two m16 row tiles) across all keys and the whole head dim, so the softmax
// statistics of a row never leave its quad of lanes and warps share nothing but the K/V tiles.
// K and V stream through rings of `Stages` shared buffers filled by cp.async: V_j is in flight
// while S = Q·K_jᵀ is computed, K_{j+Stages} while softmax and P·V_j are. P never leaves
// registers: the accumulator layout of two n8 tiles of S is the A-operand layout of one k16 step.
// Shared rows are padded by 16 bytes, so the 8 rows that one ldmatrix phase reads fall into 8
// distinct groups of 4 banks for every head dim (no swizzle arithmetic in the loop).
#include "common/alibi.cuh"
#include "common/epilogue.cuh"
#include "common/fast_math.cuh"
#include "common/grid_dependency.cuh"
#include "common/masking.cuh"
#include "common/mma_attention.cuh"
#include "common/mma_sm80.cuh"
#include "common/params.cuh"
#include "common/softcap.cuh"
#include "common/user_scores.cuh"
#include "common/quad_reduce.cuh"
#include "common/sequence.cuh"
#include "common/tile_copy_async.cuh"
#include "common/types.cuh"
#include "mma/shape.cuh"

namespace flashjit {

constexpr int kMmaWarps = MmaShape::kWarps;

// -inf for every score whose key the row may not see; lane_row / lane_key: the lane's first row
// and first key in the accumulator layout.
template <bool Causal, bool Window, int MT, int NT, typename Lengths>
__device__ __forceinline__ void mask_scores(float (&s)[MT][NT][4], const Lengths& len,
                                            const FmhaParams& p, int lane_row, int lane_key) {
#pragma unroll
  for (int mt = 0; mt < MT; ++mt)
#pragma unroll
    for (int h = 0; h < 2; ++h) {
      const int row = lane_row + mt * 16 + h * 8;
      const int first = key_first<Window>(len, p, row), end = key_end<Causal, Window>(len, p, row);
#pragma unroll
      for (int nt = 0; nt < NT; ++nt)
#pragma unroll
        for (int e = 0; e < 2; ++e) {
          const int key = lane_key + nt * 8 + e;
          if (key >= end || (Window && key < first && key >= p.sink_tokens))
            s[mt][nt][2 * h + e] = neg_inf();
        }
    }
}

// Paged: K and V from a paged cache (FmhaParams::page_table). BlockMask: the entry that reads a
// block mask (FmhaParams::block_*), compiled beside the other for variants with a mask_mod.
template <typename T, int HeadDim, int TileM, int TileN, int Stages, bool Causal, bool Softcap,
          bool Window, bool Sink, bool Alibi, bool Varlen, bool Paged, bool BlockMask = false>
__global__ void __launch_bounds__(MmaShape::kThreads) fmha_mma_kernel(const FmhaParams p) {
  begin_after_previous_grid();
  constexpr MmaShape kShape{HeadDim, TileM, TileN, Stages};
  constexpr int kThreads = MmaShape::kThreads;
  constexpr int kPitch = kShape.pitch();
  constexpr int kWarpRows = TileM / kMmaWarps;
  constexpr int MT = kWarpRows / 16;  // m16 row tiles per warp
  constexpr int NT = TileN / 8;       // n8 key tiles of S
  constexpr int DT = HeadDim / 8;     // n8 dim tiles of O
  constexpr int kKvTile = kShape.kv_tile_elements();
  static_assert(kWarpRows % 16 == 0 && TileN % 16 == 0 && HeadDim % 16 == 0, "whole mma tiles");
  static_assert(Stages >= 1, "at least one K and one V buffer");
  static_assert(!BlockMask || user::kMaskMod, "block masks come with a mask_mod");

  extern __shared__ __align__(16) unsigned char smem[];
  T* q_tile = reinterpret_cast<T*>(smem);  // later the staging area of the output
  T* k_tiles = q_tile + TileM * kPitch;    // Stages buffers
  T* v_tiles = k_tiles + Stages * kKvTile; // Stages buffers

  const int m_tile = Causal ? gridDim.x - 1 - blockIdx.x : blockIdx.x;  // longest rows first
  const int head = blockIdx.y;
  const int batch = blockIdx.z;
  const int kv_head = head / p.heads_per_kv;
  const int row0 = m_tile * TileM;
  const int lane = threadIdx.x % 32;
  const int warp_row0 = (threadIdx.x / 32) * kWarpRows;  // first row of this warp in the tile
  const SequenceSpan seq = sequence_span<Varlen>(p, batch);
  if (Varlen && row0 >= seq.seqlen_q) return;  // past a shorter sequence's queries
  const SequenceLengths seq_lengths = seq.lengths();
  const auto& len = mask_lengths<Varlen>(seq_lengths, p);

  const T* q = static_cast<const T*>(p.q) + seq.q_batch * p.q_stride_b +
               seq.q_start * p.q_stride_s + head * p.q_stride_h;
  const T* k = static_cast<const T*>(p.k) + seq.k_batch * p.k_stride_b +
               seq.k_start * p.k_stride_s + kv_head * p.k_stride_h;
  const T* v = static_cast<const T*>(p.v) + seq.k_batch * p.v_stride_b +
               seq.k_start * p.v_stride_s + kv_head * p.v_stride_h;
  using KvStream = TileStream<T, HeadDim, TileN, kPitch, kThreads>;
  const KvStream k_stream(k, p.k_stride_s);
  const KvStream v_stream(v, p.v_stride_s);
  // Paged: the head's rows of page 0 (a sequence's rows are found through the table).
  using PagedStream = PagedTileStream<T, HeadDim, TileN, kPitch, kThreads>;
  const PagedStream k_pages(static_cast<const T*>(p.k) + kv_head * p.k_stride_h);
  const PagedStream v_pages(static_cast<const T*>(p.v) + kv_head * p.v_stride_h);
  // Key tile `tile` of K or V into the shared tile at `smem_tile` (issued, not waited on).
  const auto copy_k = [&](unsigned smem_tile, int tile) {
    if constexpr (Paged)
      k_pages.copy(p, batch, smem_tile, tile * TileN, len.seqlen_k, p.k_stride_b, p.k_stride_s);
    else
      k_stream.copy(smem_tile, tile * TileN, len.seqlen_k, p.k_stride_s);
  };
  const auto copy_v = [&](unsigned smem_tile, int tile) {
    if constexpr (Paged)
      v_pages.copy(p, batch, smem_tile, tile * TileN, len.seqlen_k, p.v_stride_b, p.v_stride_s);
    else
      v_stream.copy(smem_tile, tile * TileN, len.seqlen_k, p.v_stride_s);
  };
  const unsigned k_smem = smem_address(k_tiles);
  const unsigned v_smem = smem_address(v_tiles);
  constexpr unsigned kKvTileBytes = kKvTile * sizeof(T);

  // Key tiles visits.tile(j), j in [0, n_tiles) (kv_tile_range: a window's sink tiles, then its
  // band; or a block mask's list). cp.async groups, one per tile, in the order K0 V0 K1 V1 ...:
  // the prologue issues Q with K0, then up to V_{Stages-2} and K_{Stages-1}; iteration j adds
  // V_{j+Stages-1} and K_{j+Stages}. So when K_j or V_j is waited for, exactly 2·(Stages-1)
  // newer groups exist. Tiles past the end commit empty groups to keep that count.
  const auto visits = [&] {
    const TileRange range = kv_tile_range<Causal, Window, TileM, TileN>(len, p, row0);
    if constexpr (BlockMask) {  // the block mask lists the tiles
      ListedVisits<TileRange, true> listed{range, nullptr, 0, 0, 0};
      list_block_mask(listed, p, batch, head, m_tile);
      return listed;
    } else {
      return range;
    }
  }();
  const int n_tiles = visits.count();
  TileStream<T, HeadDim, TileM, kPitch, kThreads>(q, p.q_stride_s)
      .copy(smem_address(q_tile), row0, len.seqlen_q, p.q_stride_s);
#pragma unroll
  for (int j = 0; j < Stages; ++j) {
    if (j < n_tiles)
      copy_k(k_smem + j * kKvTileBytes, visits.tile(j));
    cp_async_commit();
    if (j == Stages - 1) break;
    if (j < n_tiles)
      copy_v(v_smem + j * kKvTileBytes, visits.tile(j));
    cp_async_commit();
  }

  // This lane's ldmatrix row addresses (see mma_sm80.cuh for which lane feeds which matrix).
  const unsigned q_addr =
      smem_address(q_tile + (warp_row0 + lane % 16) * kPitch + (lane / 16) * 8);
  const unsigned k_addr =
      smem_address(k_tiles + (lane % 8 + (lane / 16) * 8) * kPitch + ((lane / 8) % 2) * 8);
  const unsigned v_addr =
      smem_address(v_tiles + (lane % 8 + ((lane / 8) % 2) * 8) * kPitch + (lane / 16) * 8);

  float o[MT][DT][4];
  float row_max[MT][2], row_sum[MT][2];
  start_online_softmax<MT, DT>(o, row_max, row_sum);

  // ALiBi: every row of the CTA has its head's slope; the diagonals grow with the rows.
  const float alibi_slope = Alibi ? alibi_raw_slope(p, head) : 0.f;
  const int alibi_diagonal = row0 + warp_row0 + lane / 4 + len.seqlen_k - len.seqlen_q;

  for (int j = 0; j < n_tiles; ++j) {
    const int tile = visits.tile(j);
    const unsigned stage_offset = j % Stages * kKvTileBytes;
    cp_async_wait<2 * (Stages - 1)>();
    __syncthreads();  // K_tile has landed for all; every warp is done with P·V of tile - 1
    if (j + Stages - 1 < n_tiles)
      copy_v(v_smem + (j + Stages - 1) % Stages * kKvTileBytes, visits.tile(j + Stages - 1));
    cp_async_commit();

    float s[MT][NT][4];
    gemm_qk<T, HeadDim, MT, NT, kPitch>(s, q_addr, k_addr + stage_offset);
    soft_cap<Softcap>(s, p);
    scale_for_score_mod<Softcap>(s, p);
    const int key0 = tile * TileN;
    if constexpr (Alibi)
      add_alibi<MT, NT>(
          s, [&](int, int) { return alibi_slope; },
          [&](int mt, int h) { return alibi_diagonal + mt * 16 + h * 8; }, key0 + (lane % 4) * 2);
    // With a mask_mod every tile is masked but those a block mask lists as untouched. (Only in
    // the block-mask entry: even an empty branch changed the other kernels' machine code.)
    const auto user_row = [&](int mt, int h) {
      return UserRow{min(row0 + warp_row0 + lane / 4 + mt * 16 + h * 8, len.seqlen_q - 1), head};
    };
    if constexpr (BlockMask) {
      if (visits.untouched(j))
        user_scores_m16n8<false, MT, NT>(s, p, batch, user_row, len.seqlen_k, key0 + (lane % 4) * 2);
      else
        user_scores_m16n8<true, MT, NT>(s, p, batch, user_row, len.seqlen_k, key0 + (lane % 4) * 2);
    } else {
      user_scores_m16n8<true, MT, NT>(s, p, batch, user_row, len.seqlen_k, key0 + (lane % 4) * 2);
    }
    if (tile_needs_band_mask<Causal, Window, kWarpRows, TileN>(len, p, row0 + warp_row0, key0))
      mask_scores<Causal, Window, MT, NT>(s, len, p, row0 + warp_row0 + lane / 4,
                                          key0 + (lane % 4) * 2);

    cp_async_wait<2 * (Stages - 1)>();
    __syncthreads();  // V_tile has landed for all; every warp is done reading K_tile
    if (j + Stages < n_tiles)
      copy_k(k_smem + j % Stages * kKvTileBytes, visits.tile(j + Stages));
    cp_async_commit();

    unsigned probs[MT][NT / 2][4];
    online_softmax<T, MT, NT, DT>(s, o, probs, row_max, row_sum, p.scale_log2);
    gemm_pv<T, MT, NT, DT, kPitch>(o, probs, v_addr + stage_offset);
  }

  // Epilogue: normalize, stage the warp's rows in its own slice of the Q tile (only this warp
  // ever read it), then store whole 16-byte vectors. The barrier covers the no-tile case, where
  // other threads' Q copies may still be landing in this slice.
  cp_async_wait<0>();
  __syncthreads();
  // Read again, not kept across the loop (d64 causal varlen at 255 registers spilled 100 B).
  const SequenceSpan out_seq = sequence_span<Varlen>(p, batch);
#pragma unroll
  for (int mt = 0; mt < MT; ++mt)
#pragma unroll
    for (int h = 0; h < 2; ++h) {
      const RowFinish finish = finish_row<Sink>(p, head, row_max[mt][h], quad_sum(row_sum[mt][h]));
      const float scale = finish.scale;
      const int local_row = warp_row0 + mt * 16 + h * 8 + lane / 4;
      unsigned* staged = reinterpret_cast<unsigned*>(q_tile + local_row * kPitch + (lane % 4) * 2);
#pragma unroll
      for (int dt = 0; dt < DT; ++dt)
        staged[dt * 4] = pack2<T>(o[mt][dt][2 * h] * scale, o[mt][dt][2 * h + 1] * scale);
      const int row = row0 + local_row;
      if (p.lse != nullptr && lane % 4 == 0 && row < len.seqlen_q)
        store_row_lse<Varlen>(p, batch, head, row, finish.lse(), out_seq.q_start);
    }
  __syncwarp();
  T* o_base = static_cast<T*>(p.o) + out_seq.q_batch * p.o_stride_b +
               out_seq.q_start * p.o_stride_s + head * p.o_stride_h;
  static_assert(kWarpRows * DT % 32 == 0, "whole rounds of 32 vectors");
#pragma unroll
  for (int i0 = 0; i0 < kWarpRows * DT; i0 += 32) {
    const int r = warp_row0 + (i0 + lane) / DT;
    const int c = ((i0 + lane) % DT) * 8;
    if (row0 + r < len.seqlen_q)
      *reinterpret_cast<uint4*>(o_base + (row0 + r) * p.o_stride_s + c) =
          *reinterpret_cast<const uint4*>(q_tile + r * kPitch + c);
  }
}

}  // namespace flashjit

// fmha_decode: attention for few query rows per KV head (decode, speculative decode), bound by
// reading K and V, on tensor cores (mma.sync, sm_80 on), over dense or paged KV caches.
//
// Layout of the work: one CTA per (row block, split, KV head, sequence), 4 warps per row group of
// up to 32 rows (tiles of 64 rows have two). GQA packing: the rows of a CTA are the (query token,
// query head) pairs of one KV head, row = token * group + head-in-group, so each K/V tile is read
// once for all of them. Split-KV: the keys of a sequence are divided among num_splits CTAs, whose
// partial results the merge kernel combines through their LSE. Inside a row group the warps
// divide each K/V tile (tile_n / 4 keys each) and keep independent online-softmax states over
// their keys, so no warp waits for another until the end, where the four states are merged
// through shared memory. K and V stream through a ring of `Stages` stages
// filled by cp.async, one commit group per tile, gathering a paged cache row by row through its
// page table (16-byte copies, so any page size that is a multiple of 8 rows works). On Hopper
// (Tma) warp 0 fills each stage with TMA boxes instead (whole tiles of a dense cache, or
// page-sized runs of rows of a paged one), completing on the stage's mbarrier, into 128-byte-
// swizzled chunks that ldmatrix reads without bank conflicts.
#include "common/alibi.cuh"
#include "common/epilogue.cuh"
#include "common/fast_math.cuh"
#include "common/grid_dependency.cuh"
#include "common/masking.cuh"
#include "common/mma_attention.cuh"
#include "common/mma_sm80.cuh"
#include "common/page_boxes.cuh"
#include "common/paged_keys.cuh"
#include "common/params.cuh"
#include "common/sequence.cuh"
#include "common/softcap.cuh"
#include "common/user_scores.cuh"
#include "common/sm90_tma.cuh"
#include "common/types.cuh"
#include "decode/shape.cuh"

namespace flashjit {

template <typename T, int HeadDim, int TileM, int TileN, int Stages, bool Causal, bool Paged,
          bool Tma, bool Softcap, bool Window, bool Sink, bool Alibi>
__global__ void __launch_bounds__(DecodeShape{HeadDim, TileM, TileN, Stages, Tma}.threads())
    fmha_decode_kernel(const FmhaParams p, const __grid_constant__ TmaDescriptor k_map,
                       const __grid_constant__ TmaDescriptor v_map) {
  begin_after_previous_grid();
  constexpr DecodeShape kShape{HeadDim, TileM, TileN, Stages, Tma};
  constexpr int kThreads = kShape.threads();
  constexpr int kPitch = kShape.pitch();
  constexpr int kWarpKeys = kShape.keys_per_warp();
  constexpr int kKeyWarps = DecodeShape::kKeyWarps;
  constexpr int kGroupRows = kShape.group_rows();
  constexpr int MT = kGroupRows / 16;  // m16 row tiles (every warp holds all its group's rows)
  constexpr int NT = kWarpKeys / 8;   // n8 key tiles of a warp's S
  constexpr int DT = HeadDim / 8;     // n8 dim tiles of O
  constexpr int kVecs = HeadDim / 8;  // 16-byte vectors per row
  constexpr int kPassRows = kThreads / kVecs;  // rows one copy pass covers
  static_assert(TileM % 16 == 0 && kWarpKeys % 16 == 0 && HeadDim % 16 == 0, "whole mma tiles");
  static_assert(kThreads % kVecs == 0 && TileN % kPassRows == 0 && kGroupRows * kVecs % kThreads == 0, "whole copy passes");
  static_assert(Stages >= 2, "one stage in flight while another is read");

  extern __shared__ __align__(16) unsigned char smem[];
  unsigned long long* full = reinterpret_cast<unsigned long long*>(smem);  // Tma: per stage
  T* q_tile = reinterpret_cast<T*>(smem + kShape.barrier_bytes());
  // Stage i: K tile at i * stage, V tile after it; TMA's swizzle wants them 1024-byte aligned.
  T* ring = q_tile + TileM * kPitch;
  if (Tma) {
    const unsigned offset = smem_address(ring) % DecodeShape::kSwizzleAlign;
    if (offset != 0)
      ring = reinterpret_cast<T*>(reinterpret_cast<unsigned char*>(ring) +
                                  DecodeShape::kSwizzleAlign - offset);
  }

  const int row_blocks = (p.seqlen_q * p.heads_per_kv + TileM - 1) / TileM;
  const int row_block = blockIdx.x % row_blocks;
  const int split = blockIdx.x / row_blocks;
  const int kv_head = blockIdx.y;
  const int batch = blockIdx.z;
  const int group = p.heads_per_kv;
  const int row0 = row_block * TileM;
  const int warp = threadIdx.x / 32;
  const int lane = threadIdx.x % 32;
  // Which quarter of every K/V tile this warp takes, and its row group's first row in the CTA
  // (spelled out for one group, where the compiler cannot see that warp < 4).
  constexpr bool kOneGroup = kShape.row_groups() == 1;
  const int key_warp = kOneGroup ? warp : warp % kKeyWarps;
  const int group_row0 = kOneGroup ? 0 : warp / kKeyWarps * kGroupRows;
  const int warp_row0 = row0 + group_row0;

  // This CTA's sequence: its queries are rows seq.q_start.. of a packed (varlen) q and o, else
  // batch `batch`; its keys rows seq.k_start.. of a packed dense k and v, else the sequence's own
  // (or its pages).
  const SequenceSpan seq = sequence_span(p, batch);
  const int seqlen_q = seq.seqlen_q, seqlen = seq.seqlen_k, k_start = seq.k_start;
  const int k_block = seq.k_batch;
  const long long q_offset = seq.q_batch * p.q_stride_b + seq.q_start * p.q_stride_s;
  const long long o_offset = seq.q_batch * p.o_stride_b + seq.q_start * p.o_stride_s;
  const int rows = seqlen_q * group;
  if (row0 >= rows) return;  // a shorter sequence of a varlen batch: nothing for this CTA
  // The keys packed row `row` sees (row -> query token row / group): [row_key_first,
  // row_key_end), both growing with the row.
  auto row_key_end = [&](int row) { return key_end<Causal, Window>(seq, p, row / group); };
  auto row_key_first = [&](int row) { return key_first<Window>(seq, p, row / group); };
  const int last_row = min(row0 + TileM, rows) - 1;
  const int cta_keys = max(row_key_end(last_row), 0);
  const int n_tiles = (cta_keys + TileN - 1) / TileN;
  // A window's first tiles hold no key of the CTA's rows: the splits divide the rest
  // (split_tiles covers the most tiles any CTA's rows see, ForwardProblem::key_tiles_seen).
  // So do StreamingLLM's sink tiles before it (kv_tile_range's order: sinks, then the band).
  const int first_tile = row_key_first(row0) / TileN;
  const TileRange range{n_tiles > first_tile ? sink_tile_end<Window, TileN>(p, first_tile) : 0,
                        first_tile, n_tiles};
  // This split's tiles: range.tile(v) for v in [tile_begin, tile_end).
  const int tile_begin = split * p.split_tiles;
  const int tile_end = min(tile_begin + p.split_tiles, range.count());
  // Tiles from here on need no left-side mask: every row of the CTA sees all their keys.
  const int band_start = Window ? row_key_first(last_row) : 0;

  // Q: this CTA's rows, zero past the last one.
  {
    const T* q = static_cast<const T*>(p.q) + q_offset;
#pragma unroll
    for (int i = 0; i < TileM * kVecs / kThreads; ++i) {
      const int index = i * kThreads + threadIdx.x;
      const int r = index / kVecs, c = index % kVecs * 8;
      const int row = row0 + r;
      const bool valid = row < rows;
      const int token = valid ? row / group : 0;
      const int head = kv_head * group + (valid ? row % group : 0);
      cp_async_16(smem_address(q_tile + r * kPitch + c),
                  q + token * p.q_stride_s + head * p.q_stride_h + c, valid);
    }
  }

  const int page_shift = Paged ? page_shift_of(p) : -1;
  const T* k_base = static_cast<const T*>(p.k) + kv_head * p.k_stride_h;
  const T* v_base = static_cast<const T*>(p.v) + kv_head * p.v_stride_h;
  const int copy_row = threadIdx.x / kVecs;
  const int copy_col = threadIdx.x % kVecs * 8;
  // Paged TMA: warp 0's lane b holds the page table entry of box b of the next tile to load, read
  // one tile ahead (tiles are loaded in order), so issuing a tile's boxes never waits on the page
  // table; boxes past the sequence read nothing (their entries may be anything).
  const int box_rows = Paged ? page_box_rows(p.page_size, TileN) : TileN;
  const int boxes = TileN / box_rows;
  auto read_page = [&](int tile) {
    const int key = tile * TileN + lane * box_rows;
    if (lane >= boxes || key >= seqlen) return 0;
    return __ldg(p.page_table + batch * p.page_table_stride + page_of(p, key, page_shift));
  };
  int next_page = 0;
  // Issues the copies of key tile range.tile(v) into ring stage `stage`; keys past the sequence
  // are zero-filled (reading nothing), so padding never brings NaN into P·V.
  auto load_tile = [&](int v, int stage) {
    const int tile = range.tile(v);
    T* k_smem = ring + stage * kShape.stage_elements();
    T* v_smem = k_smem + kShape.tile_elements();
    if constexpr (Tma) {
      // Warp 0 only: lane 0 announces the stage's bytes, then lane b issues box b (a run of rows
      // within one page) from the page table entry it read a tile ago. Boxes wholly past the
      // sequence are skipped; the rows they would have filled are zeroed after the stage lands.
      constexpr int kChunks = HeadDim / DecodeShape::kBoxWidth;
      if (lane == 0) {
        const int live = min(boxes, (seqlen - tile * TileN + box_rows - 1) / box_rows);
        mbarrier_arrive_expect_tx(&full[stage], live * box_rows * kChunks *
                                                    DecodeShape::kBoxWidth * 2 * 2);  // K and V
      }
      __syncwarp();
      const int page = next_page;
      if (Paged) next_page = read_page(range.tile(v + 1));
      static_assert(TileN / 8 <= 32, "a box per lane (boxes hold at least 8 rows)");
      if (lane < boxes) {
        const int r = lane * box_rows;
        const int key = tile * TileN + r;
        if (key >= seqlen) return;
        KvRow at{k_block, k_start + key};
        if (Paged) at = {page, key - page_of(p, key, page_shift) * p.page_size};
#pragma unroll
        for (int c = 0; c < kChunks; ++c) {
          const int offset = (c * TileN + r) * DecodeShape::kBoxWidth;
          tma_load_4d(k_smem + offset, &k_map, &full[stage], c * DecodeShape::kBoxWidth, at.row,
                      kv_head, static_cast<int>(at.block));
          tma_load_4d(v_smem + offset, &v_map, &full[stage], c * DecodeShape::kBoxWidth, at.row,
                      kv_head, static_cast<int>(at.block));
        }
      }
    } else {  // (else: NVRTC warns of an unreachable loop after a return, #128-D)
#pragma unroll
      for (int pass = 0; pass < TileN / kPassRows; ++pass) {
        const int r = pass * kPassRows + copy_row;
        const int key = tile * TileN + r;
        const bool valid = key < seqlen;
        long long k_off = 0, v_off = 0;
        if (valid) {
          const KvRow at = locate_key<Paged>(p, batch, key, page_shift, k_block, k_start);
          k_off = at.block * p.k_stride_b + at.row * p.k_stride_s;
          v_off = at.block * p.v_stride_b + at.row * p.v_stride_s;
        }
        cp_async_16(smem_address(k_smem + r * kPitch + copy_col), k_base + k_off + copy_col, valid);
        cp_async_16(smem_address(v_smem + r * kPitch + copy_col), v_base + v_off + copy_col, valid);
      }
    }
  };

  // Prologue: Q with tile_begin, then up to Stages - 1 tiles, one commit group each (empty past
  // the end, so the wait below always counts Stages - 2 newer groups). With TMA, thread 0 sets up
  // the stage barriers and issues the tiles; Q stays a cp.async group.
  if constexpr (Tma) {
    if (threadIdx.x == 0) {
      tma_prefetch_descriptor(&k_map);
      tma_prefetch_descriptor(&v_map);
#pragma unroll
      for (int i = 0; i < Stages; ++i) mbarrier_init(&full[i], 1);
      mbarrier_init_fence();
    }
    __syncthreads();  // the barriers are initialized before anyone uses them
    if (warp == 0) {
      if (Paged) next_page = read_page(range.tile(tile_begin));
#pragma unroll
      for (int i = 0; i < Stages - 1; ++i)
        if (tile_begin + i < tile_end) load_tile(tile_begin + i, i);
    }
    cp_async_commit();
  } else {
#pragma unroll
    for (int i = 0; i < Stages - 1; ++i) {
      if (tile_begin + i < tile_end) load_tile(tile_begin + i, i);
      cp_async_commit();
    }
  }

  // Every lane's rows: h = 0 is row lane/4 of m-tile mt, h = 1 row lane/4 + 8; their key bounds
  // never change across tiles.
  // (A window's first keys are recomputed in the few tiles that need them: registers are short.)
  int lane_key_end[MT][2];
#pragma unroll
  for (int mt = 0; mt < MT; ++mt)
#pragma unroll
    for (int h = 0; h < 2; ++h) lane_key_end[mt][h] = row_key_end(warp_row0 + mt * 16 + h * 8 + lane / 4);
  // ALiBi: each row's head's slope and its diagonal (rows past the CTA's last take row 0's).
  float alibi_slope[MT][2];
  int alibi_diagonal[MT][2];
  if constexpr (Alibi) {
#pragma unroll
    for (int mt = 0; mt < MT; ++mt)
#pragma unroll
      for (int h = 0; h < 2; ++h) {
        int row = warp_row0 + mt * 16 + h * 8 + lane / 4;
        if (row >= rows) row = row0;
        alibi_slope[mt][h] = alibi_raw_slope(p, kv_head * group + row % group);
        alibi_diagonal[mt][h] = row / group + seqlen - seqlen_q;
      }
  }

  const unsigned q_addr =
      smem_address(q_tile + (group_row0 + lane % 16) * kPitch + (lane / 16) * 8);
  constexpr unsigned kStageBytes = kShape.stage_elements() * sizeof(T);
  // Padded tiles: this lane's ldmatrix addresses for key 0, column 0 of stage 0.
  const unsigned k_addr = smem_address(ring + (key_warp * kWarpKeys + lane % 8 + (lane / 16) * 8) *
                                                  kPitch + ((lane / 8) % 2) * 8);
  const unsigned v_addr = smem_address(ring + TileN * kPitch +
                                       (key_warp * kWarpKeys + lane % 8 + ((lane / 8) % 2) * 8) *
                                           kPitch + (lane / 16) * 8);
  // Swizzled tiles: 16-byte unit u of row r of a chunk sits at r * 128 + ((u ^ r % 8) * 16); the
  // 8 rows of one ldmatrix phase are 8 consecutive keys, so r % 8 is lane % 8 for every address.
  constexpr unsigned kChunkBytes = TileN * DecodeShape::kBoxWidth * 2;
  const unsigned ring_addr = smem_address(ring);
  const unsigned k_row = ring_addr + (key_warp * kWarpKeys + lane % 8 + (lane / 16) * 8) * 128;
  const unsigned v_row = ring_addr + kShape.tile_elements() * 2 +
                         (key_warp * kWarpKeys + lane % 8 + ((lane / 8) % 2) * 8) * 128;
  const unsigned swizzle = lane % 8;
  auto unit_offset = [&](int unit) {  // unit: 16-byte column of a row, 0 .. HeadDim / 8
    return (unit / 8) * kChunkBytes + (((unit % 8) ^ swizzle) << 4);
  };

  float o[MT][DT][4];
  float row_max[MT][2], row_sum[MT][2];
  start_online_softmax<MT, DT>(o, row_max, row_sum);

  for (int v = tile_begin; v < tile_end; ++v) {
    const int tile = range.tile(v);
    const int stage = (v - tile_begin) % Stages;
    if constexpr (Tma) {
      cp_async_wait<0>();  // Q (the first time)
      mbarrier_wait(&full[stage], ((v - tile_begin) / Stages) & 1);
      // Rows past the sequence hold whatever the skipped boxes or the cache had there: zero V's
      // (masked scores give P = 0, and 0 x NaN would still be NaN).
      const int valid = seqlen - tile * TileN;
      if (valid < TileN) {
        unsigned char* v_tile = reinterpret_cast<unsigned char*>(
            ring + stage * kShape.stage_elements() + kShape.tile_elements());
        constexpr int kUnitsPerRow = HeadDim / 8;
        for (int i = threadIdx.x; i < (TileN - valid) * kUnitsPerRow; i += kThreads) {
          const int row = valid + i / kUnitsPerRow, unit = i % kUnitsPerRow;
          *reinterpret_cast<uint4*>(v_tile + (unit / 8) * kChunkBytes + row * 128 +
                                    (unit % 8) * 16) = make_uint4(0, 0, 0, 0);
        }
      }
    } else {
      cp_async_wait<Stages - 2>();
    }
    __syncthreads();  // the tile has landed for all; every warp is done with the previous one
    if (v + Stages - 1 < tile_end && (!Tma || warp == 0))
      load_tile(v + Stages - 1, (stage + Stages - 1) % Stages);
    if (!Tma) cp_async_commit();

    float s[MT][NT][4];
    if constexpr (Tma) {
      const unsigned k_stage = k_row + stage * kStageBytes;
      gemm_qk_at<T, HeadDim, MT, NT>(
          s, [&](int mt, int kk) { return q_addr + (mt * 16 * kPitch + kk * 16) * 2; },
          [&](int np, int kk) {
            return k_stage + np * 16 * 128 + unit_offset(kk * 2 + (lane / 8) % 2);
          });
    } else {
      gemm_qk<T, HeadDim, MT, NT, kPitch>(s, q_addr, k_addr + stage * kStageBytes);
    }
    soft_cap<Softcap>(s, p);
    scale_for_score_mod<Softcap>(s, p);
    const int lane_key = tile * TileN + key_warp * kWarpKeys + (lane % 4) * 2;
    if constexpr (Alibi)
      add_alibi<MT, NT>(
          s, [&](int mt, int h) { return alibi_slope[mt][h]; },
          [&](int mt, int h) { return alibi_diagonal[mt][h]; }, lane_key);
    // Packed rows: row r is query r / group of head kv_head * group + r % group (rows past the
    // CTA's last take row 0's, as ALiBi's do).
    user_scores_m16n8<true, MT, NT>(
        s, p, batch,
        [&](int mt, int h) {
          int row = warp_row0 + mt * 16 + h * 8 + lane / 4;
          if (row >= rows) row = row0;
          return UserRow{row / group, kv_head * group + row % group};
        },
        seqlen, lane_key);
    // A lane's first row sees the fewest keys on the right (limits grow with the row); on the
    // left the CTA's last row cuts deepest.
    if (tile * TileN + TileN > lane_key_end[0][0] || (Window && tile * TileN < band_start)) {
#pragma unroll
      for (int mt = 0; mt < MT; ++mt)
#pragma unroll
        for (int h = 0; h < 2; ++h) {
          const int first = Window ? row_key_first(warp_row0 + mt * 16 + h * 8 + lane / 4) : 0;
#pragma unroll
          for (int nt = 0; nt < NT; ++nt)
#pragma unroll
            for (int e = 0; e < 2; ++e) {
              const int key = lane_key + nt * 8 + e;
              if (key >= lane_key_end[mt][h] || (Window && key < first && key >= p.sink_tokens))
                s[mt][nt][2 * h + e] = neg_inf();
            }
        }
    }
    unsigned probs[MT][NT / 2][4];
    online_softmax<T, MT, NT, DT>(s, o, probs, row_max, row_sum, p.scale_log2);
    if constexpr (Tma) {
      const unsigned v_stage = v_row + stage * kStageBytes;
      gemm_pv_at<T, MT, NT, DT>(o, probs, [&](int kk, int dp) {
        return v_stage + kk * 16 * 128 + unit_offset(dp * 2 + lane / 16);
      });
    } else {
      gemm_pv<T, MT, NT, DT, kPitch>(o, probs, v_addr + stage * kStageBytes);
    }
  }

  // Merge the key warps' states, one row group at a time (the ring holds one group's): its warps
  // write their unnormalized outputs and row statistics over the ring (all copies done and read),
  // then every thread finishes 8 columns of some of the group's rows.
  cp_async_wait<0>();
  constexpr int kMergePitch = kShape.merge_pitch();
  float* merged = reinterpret_cast<float*>(ring);  // [key warp][group row][merge pitch]
  float* stats = merged + kKeyWarps * kGroupRows * kMergePitch;  // [key warp][group row]: max, sum
  const bool partial = p.num_splits > 1;
#pragma unroll
  for (int g = 0; g < kShape.row_groups(); ++g) {
    __syncthreads();  // the ring is free: read by the key loop, or by the last group's merge
    if (group_row0 == g * kGroupRows) {
#pragma unroll
      for (int mt = 0; mt < MT; ++mt)
#pragma unroll
        for (int h = 0; h < 2; ++h) {
          const int r = mt * 16 + h * 8 + lane / 4;
          const float sum = quad_sum(row_sum[mt][h]);
          float* row_out = merged + (key_warp * kGroupRows + r) * kMergePitch + (lane % 4) * 2;
#pragma unroll
          for (int dt = 0; dt < DT; ++dt)
            *reinterpret_cast<float2*>(row_out + dt * 8) =
                make_float2(o[mt][dt][2 * h], o[mt][dt][2 * h + 1]);
          if (lane % 4 == 0) {
            stats[(key_warp * kGroupRows + r) * 2] = row_max[mt][h];
            stats[(key_warp * kGroupRows + r) * 2 + 1] = sum;
          }
        }
    }
    __syncthreads();

#pragma unroll
    for (int i = 0; i < kGroupRows * kVecs / kThreads; ++i) {
      const int index = i * kThreads + threadIdx.x;
      const int r = index / kVecs, c = index % kVecs * 8;
      const int row = row0 + g * kGroupRows + r;
      if (row >= rows) continue;
      float2 state[kKeyWarps];  // each key warp's (max, sum) of the row
      float best = neg_inf();
#pragma unroll
      for (int w = 0; w < kKeyWarps; ++w) {
        state[w] = *reinterpret_cast<const float2*>(stats + (w * kGroupRows + r) * 2);
        best = fmaxf(best, state[w].x);
      }
      float total = 0.f, acc[8] = {};
#pragma unroll
      for (int w = 0; w < kKeyWarps; ++w) {
        const float weight =
            state[w].x == neg_inf() ? 0.f : exp2_ftz((state[w].x - best) * p.scale_log2);
        total += state[w].y * weight;
        // 16-byte reads, the second half first in every other group of four threads: the eight
        // threads of one shared-memory phase (32 bytes apart) then hit eight distinct 16-byte bank
        // groups. Scalar reads here were 8-way bank conflicts: ~5 us per CTA at 32 rows, 2.3 % of
        // a batch-64 speculative decode (docs/perf-log.md, session 12).
        const float* from = merged + (w * kGroupRows + r) * kMergePitch + c;
        const bool swap = (threadIdx.x / 4) % 2;
        const float4 first = *reinterpret_cast<const float4*>(from + (swap ? 4 : 0));
        const float4 second = *reinterpret_cast<const float4*>(from + (swap ? 0 : 4));
        const float4 lo = swap ? second : first, hi = swap ? first : second;
        acc[0] += lo.x * weight, acc[1] += lo.y * weight, acc[2] += lo.z * weight;
        acc[3] += lo.w * weight, acc[4] += hi.x * weight, acc[5] += hi.y * weight;
        acc[6] += hi.z * weight, acc[7] += hi.w * weight;
      }
      const int token = row / group;
      const int head = kv_head * group + row % group;
      // A split's partial must count the sink once: split 0 takes it (the merge adds the states).
      const RowFinish finish = finish_row<Sink>(p, head, best, total, split == 0);
      const float scale = finish.scale, lse = finish.lse();
      if (partial) {
        const long long out_row =
            static_cast<long long>(split) * p.batch * p.seqlen_q * p.heads_q +
            (static_cast<long long>(batch) * p.seqlen_q + token) * p.heads_q + head;
        float4* to = reinterpret_cast<float4*>(p.o_partial + out_row * HeadDim + c);
        to[0] = make_float4(acc[0] * scale, acc[1] * scale, acc[2] * scale, acc[3] * scale);
        to[1] = make_float4(acc[4] * scale, acc[5] * scale, acc[6] * scale, acc[7] * scale);
        if (c == 0) p.lse_partial[out_row] = lse;
      } else {
        uint4 packed;
        packed.x = pack2<T>(acc[0] * scale, acc[1] * scale);
        packed.y = pack2<T>(acc[2] * scale, acc[3] * scale);
        packed.z = pack2<T>(acc[4] * scale, acc[5] * scale);
        packed.w = pack2<T>(acc[6] * scale, acc[7] * scale);
        T* to = static_cast<T*>(p.o) + o_offset + token * p.o_stride_s + head * p.o_stride_h + c;
        *reinterpret_cast<uint4*>(to) = packed;
        if (c == 0 && p.lse != nullptr) p.lse[lse_offset<true>(p, batch, seq.q_start, head, token)] = lse;
      }
    }
  }
}

}  // namespace flashjit

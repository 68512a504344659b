// fmha_wgmma: the Hopper attention forward (sm_90a only), built like FlashAttention-3.
//
// One CTA per SM loops over work units (a persistent grid; wgmma/schedule.cuh says which, for dense
// and varlen batches). Warpgroup 0 is the producer: one thread issues TMA loads of the Q tile and
// of a Stages-deep ring of K and V tiles into 128-byte-swizzled shared memory, each completing on
// an mbarrier (over a paged KV cache one warp, a key tile in page-sized runs of rows; in small
// pages the whole warpgroup, gathering rows with cp.async). Warpgroups
// 1..TileM/64 are consumers: each owns 64 query rows and runs S = Q·Kᵀ (wgmma, both operands in
// shared memory), the online softmax in registers, and O += P·V (wgmma, P straight from the S
// registers). Registers move from the producer to the consumers with setmaxnreg; at d64/d128
// consumers take turns issuing GEMMs (ping-pong), and every consumer overlaps softmax(j) with
// P·V(j-1). With three consumers O leaves through a staging buffer and a TMA store that runs
// while the warpgroup starts its next tile; otherwise with 16-byte stores from registers.
#include "common/compile_flags.cuh"
#include "common/cp_async.cuh"
#include "common/alibi.cuh"
#include "common/epilogue.cuh"
#include "common/exp2_fma.cuh"
#include "common/fast_math.cuh"
#include "common/global_store.cuh"
#include "common/grid_dependency.cuh"
#include "common/masking.cuh"
#include "common/page_boxes.cuh"
#include "common/paged_keys.cuh"
#include "common/params.cuh"
#include "common/quad_reduce.cuh"
#include "common/quad_transpose.cuh"
#include "common/sequence.cuh"
#include "common/sm90_mbarrier.cuh"
#include "common/sm90_stmatrix.cuh"
#include "common/sm90_tma.cuh"
#include "common/sm90_warpgroup.cuh"
#include "common/sm90_wgmma.cuh"
#include "common/softcap.cuh"
#include "common/types.cuh"
#include "common/user_scores.cuh"
#include "wgmma/alibi.cuh"
#include "wgmma/schedule.cuh"
#include "wgmma/shape.cuh"

namespace flashjit {

template <int Stages>
struct PipelineBarriers {
  unsigned long long q_full, q_empty;
  unsigned long long k_full[Stages], k_empty[Stages];
  unsigned long long v_full[Stages], v_empty[Stages];
  UnitRing units;  // the scheduler's slot (schedule_units)
};

struct TileCoord {
  int m_block, head, batch;
};

// Whether a variant's key tiles follow each query tile's window band (TileOrder::shift): not over
// a paged cache, whose tiles' runs of rows follow its pages. H100, 32k causal window 4096 d128:
// 3.317 -> 3.144 ms, 1.129 -> 1.074x the ideal (docs/perf-log.md, session 48). Varlen batches,
// ALiBi and user functions keep tiles on multiples of TileN until their window cases have run on
// a GPU with the shift (their key positions come from key0 as well).
template <bool Window, bool Paged, bool Varlen, bool Alibi>
inline constexpr bool kShiftedBands = Window && !Paged && !Varlen && !Alibi && !kUserFunctions;

// ---- producer ---------------------------------------------------------------------------------

// A row of a paged cache: its page (-1: past the sequence, not loaded) and its row in the page.
struct PageRow {
  int page, row;
};

// Rows of a K or V tile that the producer warpgroup gathers with cp.async (WgmmaSchedule::
// gather_pages). Thread t copies 16-byte chunk t % 8 of each 128-byte column-block row of rows
// 16·pass + t / 8: a row's 8 chunks are 8 adjacent threads (128 contiguous bytes a request), and
// since 16·pass keeps the row's residue mod 8, a thread's swizzled chunk (c ^ (row % 8), the 128B
// swizzle TMA would have applied) is the same in every pass. Each thread looks up the page of one
// row (gather_row) before the slot's wait; pass `pass` reads it from lane (lane & ~7) | pass.
template <int TileN>
struct RowGather {
  static constexpr int kChunksPerRow = 8;  // 16-byte chunks per 128-byte column-block row
  static constexpr int kRowsPerPass = kWarpgroupThreads / kChunksPerRow;
  static constexpr int kPasses = TileN / kRowsPerPass;

  // The row whose page this thread looks up: the one lane (lane & ~7) | pass copies in `pass`.
  __device__ __forceinline__ static int gather_row(int thread) {
    static_assert(TileN <= kMaxPagedTileN && kPasses <= kChunksPerRow,
                  "each row's page is looked up by one of its 8 lanes");
    const int lane = thread % 32, warp = thread / 32;
    return (lane % kChunksPerRow) * kRowsPerPass + (warp * 32 + lane - lane % kChunksPerRow) /
                                                       kChunksPerRow;
  }

  // Copies this thread's chunks of a tile whose rows' pages (run.page, -1 past the sequence:
  // zeros) and rows in them this thread's lanes hold, then arrives on `full` once they land.
  template <typename T, int HeadDim>
  __device__ __forceinline__ static void copy(unsigned char* tile, const void* base,
                                              long long stride_page, long long stride_row,
                                              long long head_offset, const PageRow& run,
                                              unsigned long long* full) {
    const int thread = threadIdx.x % kWarpgroupThreads, lane = thread % 32;
    const int chunk = thread % kChunksPerRow, row_in_pass = thread / kChunksPerRow;
    const unsigned dst = smem_u32(tile) + row_in_pass * WgmmaGeometry::kRowBytes +
                         ((chunk ^ (row_in_pass % 8)) * 16);
    // This lane's row, whose address the lanes copying it read by shuffle; null past the
    // sequence (those copies zero-fill, reading nothing).
    const T* mine = run.page < 0 ? nullptr
                                 : static_cast<const T*>(base) + head_offset +
                                       static_cast<unsigned>(run.page) * stride_page +
                                       static_cast<unsigned>(run.row) * stride_row;
#pragma unroll
    for (int pass = 0; pass < kPasses; ++pass) {
      const T* row = reinterpret_cast<const T*>(
          __shfl_sync(0xffffffffu, reinterpret_cast<unsigned long long>(mine),
                      (lane & ~(kChunksPerRow - 1)) | pass));
#pragma unroll
      for (int b = 0; b < HeadDim / 64; ++b)
        cp_async_16(dst + (b * TileN + pass * kRowsPerPass) * WgmmaGeometry::kRowBytes,
                    row + chunk * (16 / sizeof(T)) + b * 64, row != nullptr);
    }
    cp_async_arrive_noinc(smem_u32(full));
  }
};

// Dense caches: thread 0 runs this and issues every load, a key tile in HeadDim / 64 boxes. Paged
// caches: the producer warpgroup runs it. In large pages warp 0 loads a key tile in page-sized
// runs of rows (page_box_rows), lane b looking up and issuing run b (lane 0 also Q and the
// stage's byte count); in small ones (gather_pages) all four warps gather its rows (RowGather).
// Either way the page-table reads of a tile go out together, before the wait for its slot.
template <typename T, int HeadDim, int TileM, int TileN, int Stages, bool Causal, bool Varlen,
          bool Window, bool BlockMask, bool Paged, bool Gather, bool MayTakeUnits, bool Shifted>
__device__ __forceinline__ void produce(const FmhaParams& p, const WgmmaSchedule& sched,
                                        const VarlenTable* table, const TmaDescriptor* tma_q,
                                        const TmaDescriptor* tma_k, const TmaDescriptor* tma_v,
                                        unsigned char* smem, PipelineBarriers<Stages>* bars) {
  using Shape = WgmmaShape<HeadDim, TileM, TileN, Stages>;
  using Rows = RowGather<TileN>;
  static_assert(Paged || !Gather, "gathers rows of pages");
  const int thread = threadIdx.x % kWarpgroupThreads, lane = thread % 32;
  const bool leader = thread == 0;
  const int page_shift = Paged ? page_shift_of(p) : -1;
  const int box_rows = Paged ? page_box_rows(p.page_size, TileN) : TileN;
  // The first key of the tile's row this thread looks up: run `lane`'s, or gather_row's.
  int my_row = lane * box_rows;
  if constexpr (Gather) my_row = Rows::gather_row(thread);
  static_assert(!Paged || (TileN & (TileN - 1)) == 0, "page-sized runs of rows fill a tile");
  static_assert(TileN / 16 <= 32, "a run per lane (runs of at least 16 rows)");
  int pipe = 0, q_loads = 0;
  UnitSequence<Varlen, MayTakeUnits, false> units(p, sched, table, &bars->units);
  for (int unit = units.next(); unit >= 0; unit = units.next()) {
    const WorkUnit<Causal, HeadDim, TileM, TileN, Varlen> u(p, sched, table, unit,
                                                            takes_units<MayTakeUnits>(p, sched));
    const SequenceSpan seq = sequence_span<Varlen>(p, u.batch);
    for (int which = 0; which < u.tiles(); ++which) {
      const int row0 = u.m_block(which) * TileM;
      if (Varlen && row0 >= seq.seqlen_q) continue;  // past a shorter sequence (unsorted varlen)
      const TileVisits<Window, BlockMask> order =
          tile_visits<Causal, Window, BlockMask, TileM, TileN, Shifted>(seq, p, u.batch, u.head,
                                                                        u.m_block(which));
      if (order.count() <= 0) continue;  // the consumers write zeros, pipeline untouched
      // Paged: the page of this thread's row of visit i's key tile (or of its run's first row)
      // and the row there, or {-1, 0} past the sequence: not loaded (its page-table entry may be
      // anything), and the consumers zero those V rows.
      auto locate = [&](int i) -> PageRow {
        if (!Paged) return {};
        const int key = order.template key0<TileN>(i) + my_row;
        if (my_row >= TileN || key >= seq.seqlen_k) return {-1, 0};
        const KvRow at = locate_key<true>(p, u.batch, key, page_shift, 0, 0);
        return {static_cast<int>(at.block), at.row};
      };
      // The unit's first two tiles' pages, looked up before the wait for Q's buffer (the previous
      // unit's last tile), so they are back when its first K load goes out.
      PageRow run{}, next{};
      if constexpr (Paged) {
        run = locate(0);
        next = order.count() > 1 ? locate(1) : run;
      }
      // Q's buffer is free once every consumer warp has finished its last Q·Kᵀ of the last tile.
      if (q_loads > 0) mbarrier_wait(&bars->q_empty, (q_loads - 1) & 1);
      ++q_loads;
      if (leader) {
        mbarrier_arrive_expect_tx(&bars->q_full, Shape::kQBytes);
#pragma unroll
        for (int b = 0; b < Shape::kDimBlocks; ++b)
          tma_load_4d(smem + Shape::kQOffset + b * TileM * Shape::kRowBytes, tma_q, &bars->q_full,
                      64 * b, seq.q_start + row0, u.head, seq.q_batch);
      }
      const int kv_head = u.head / p.heads_per_kv;
      // The key tile of visit i into its ring's slot `at` (counted over the whole loop) once the
      // consumers have freed it. A fresh barrier counts as having completed the phase before
      // phase 0: parity ^ 1 passes.
      auto load = [&](unsigned long long* empty, unsigned long long* full, int offset,
                      const TmaDescriptor* map, bool keys, int i, int at, const PageRow& run) {
        const int key0 = order.template key0<TileN>(i);
        const int stage = at % Stages;
        // Runs of pages: the rows up to the last run holding a key (box_rows is a power of two),
        // counted before the wait so nothing but the byte count stands between a freed slot
        // and its loads.
        const int run_rows =
            Paged && !Gather ? min(TileN, (seq.seqlen_k - key0 + box_rows - 1) & -box_rows)
                             : 0;
        mbarrier_wait(&empty[stage], ((at / Stages) & 1) ^ 1);
        unsigned char* tile = smem + offset + stage * Shape::kKVBytes;
        if constexpr (!Paged) {
          mbarrier_arrive_expect_tx(&full[stage], Shape::kKVBytes);
#pragma unroll
          for (int b = 0; b < Shape::kDimBlocks; ++b)
            tma_load_4d(tile + b * TileN * Shape::kRowBytes, map, &full[stage], 64 * b,
                        seq.k_start + key0, kv_head, seq.k_batch);
        } else if constexpr (Gather) {
          Rows::template copy<T, HeadDim>(
              tile, keys ? p.k : p.v, keys ? p.k_stride_b : p.v_stride_b,
              keys ? p.k_stride_s : p.v_stride_s,
              kv_head * (keys ? p.k_stride_h : p.v_stride_h), run, &full[stage]);
        } else {
          if (lane == 0)
            mbarrier_arrive_expect_tx(&full[stage],
                                      run_rows * Shape::kRowBytes * Shape::kDimBlocks);
          __syncwarp();  // the bytes are announced before any run can land
          if (run.page >= 0)
#pragma unroll
            for (int b = 0; b < Shape::kDimBlocks; ++b)
              tma_load_4d(tile + (b * TileN + lane * box_rows) * Shape::kRowBytes, map,
                          &full[stage], 64 * b, run.row, kv_head, run.page);
        }
      };
      // Keys ahead (WgmmaGeometry::keys_ahead): K(j + 1) before V(j), since K's slot frees once
      // both consumers' S(j - 1) is done and V's only after their P·V(j - 2); else K(j), V(j).
      // Tiles go in the consumers' order (TileOrder), the i-th into slot pipe + i. Paged: `run`
      // is the i-th tile's, `next` the one after it, `after` the next one's, looked up an
      // iteration before its first load.
      if (Shape::kKeysAhead)
        load(bars->k_empty, bars->k_full, Shape::kKOffset, tma_k, true, 0, pipe, run);
      for (int i = 0; i < order.count(); ++i, ++pipe) {
        PageRow after{};
        if constexpr (Paged) after = i + 2 < order.count() ? locate(i + 2) : next;
        if (!Shape::kKeysAhead)
          load(bars->k_empty, bars->k_full, Shape::kKOffset, tma_k, true, i, pipe, run);
        else if (i + 1 < order.count())
          load(bars->k_empty, bars->k_full, Shape::kKOffset, tma_k, true, i + 1, pipe + 1, next);
        load(bars->v_empty, bars->v_full, Shape::kVOffset, tma_v, false, i, pipe, run);
        run = next;
        next = after;
      }
    }
  }
}

// ---- consumer pieces --------------------------------------------------------------------------

// Where this thread's accumulator elements sit in its warpgroup's 64 x N tile.
struct FragmentPosition {
  int row;  // first of the thread's two rows (the other is row + 8)
  int col;  // first of its two adjacent columns in each 8-column block
};

__device__ __forceinline__ FragmentPosition fragment_position() {
  const int lane = threadIdx.x % 32;
  const int warp = (threadIdx.x / 32) % 4;
  return {16 * warp + lane / 4, 2 * (lane % 4)};
}

// S = Q·Kᵀ for this warpgroup's 64 rows and one K stage (issued and committed, not waited on);
// with AlibiSlice one more k16 slice, alibi_q's rows times alibi_k's (AlibiSlices).
template <typename T, int HeadDim, int TileM, int TileN, bool AlibiSlice = false>
__device__ __forceinline__ void issue_qk(float (&s)[TileN / 2], unsigned q_rows, unsigned k_tile,
                                         unsigned alibi_q = 0, unsigned alibi_k = 0) {
  wgmma_fence();
  const unsigned long long q_desc = smem_desc_sw128(q_rows, 16, 1024);
  const unsigned long long k_desc = smem_desc_sw128(k_tile, 16, 1024);
#pragma unroll
  for (int kk = 0; kk < HeadDim / 16; ++kk) {
    // 16 head dims = 32 bytes inside a 128-byte swizzle row; every 4 slices the next column block.
    const unsigned long long desc_q =
        smem_desc_advance(q_desc, (kk / 4) * TileM * 128 + (kk % 4) * 32);
    const unsigned long long desc_k =
        smem_desc_advance(k_desc, (kk / 4) * TileN * 128 + (kk % 4) * 32);
    if (kk == 0)
      wgmma_ss<T, TileN, false>(s, desc_q, desc_k);
    else
      wgmma_ss<T, TileN, true>(s, desc_q, desc_k);
  }
  if constexpr (AlibiSlice)
    wgmma_ss<T, TileN, true>(s, smem_desc_sw32(alibi_q), smem_desc_sw32(alibi_k));
  wgmma_commit();
}

// O += P·V for one V stage, P as wgmma A fragments (issued and committed, not waited on).
template <typename T, int HeadDim, int TileN>
__device__ __forceinline__ void issue_pv(float (&o)[HeadDim / 2],
                                         const unsigned (&p)[TileN / 16][4], unsigned v_tile) {
  wgmma_fence();
  const unsigned long long v_desc = smem_desc_sw128(v_tile, TileN * 128, 1024);
#pragma unroll
  for (int kk = 0; kk < TileN / 16; ++kk) {
    // 16 keys = two 8-row groups (stride 1024 B); head dims step by column block (TileN rows).
    const unsigned long long desc_v = smem_desc_advance(v_desc, kk * 16 * 128);
    wgmma_rs_tnsp_b<T, HeadDim>(o, p[kk], desc_v);
  }
  wgmma_commit();
}

// Scores of keys a row may not see become -inf (past seqlen_k, above the causal diagonal, outside
// the window but for its sink tokens). `key` is the thread's first column; comparisons are against
// per-row bounds relative to it, so each element costs a compare (three with a window) with an
// immediate.
template <bool Causal, bool Window, int TileN>
__device__ __forceinline__ void mask_scores(float (&s)[TileN / 2], const SequenceLengths& seq,
                                            const FmhaParams& p, int row, int key) {
  const int end[2] = {key_end<Causal, Window>(seq, p, row) - key,
                      key_end<Causal, Window>(seq, p, row + 8) - key};
  const int first[2] = {key_first<Window>(seq, p, row) - key,
                        key_first<Window>(seq, p, row + 8) - key};
  const int sink_end = Window ? p.sink_tokens - key : 0;
#pragma unroll
  for (int e = 0; e < TileN / 2; ++e) {
    const int column = 8 * (e / 4) + e % 2;
    if (column >= end[(e / 2) % 2] ||
        (Window && column < first[(e / 2) % 2] && column >= sink_end))
      s[e] = neg_inf();
  }
}

// Online softmax of the two rows a thread holds. The max is reduced across the 4 threads of a row
// every tile; the sum stays per-thread until the end (its rescaling is the same on all 4).
struct RowSoftmax {
  float max[2] = {neg_inf(), neg_inf()};
  float sum[2] = {0.f, 0.f};

  // Turns scores into unnormalized probabilities in place; returns how much O must shrink.
  // Biased: row i's scores are s + row_bias[i] (ALiBi's per-row part, alibi_scores), added to the
  // max and folded into the exponent's offset rather than into every score.
  template <bool Biased = false, int N>
  __device__ __forceinline__ void update(float (&s)[N], float scale_log2, float (&correction)[2],
                                         const float (&row_bias)[2] = {0.f, 0.f}) {
#pragma unroll
    for (int i = 0; i < 2; ++i) {
      // Four independent partial maxima: the reduction is on the path to every exponential, and
      // one chain over the row would be N / 2 dependent steps.
      static_assert(N >= 8, "two 8-column blocks at least");
      float partial[4] = {s[2 * i], s[2 * i + 1], s[2 * i + 4], s[2 * i + 5]};
#pragma unroll
      for (int e = 2 * i + 8; e < N; e += 4) {
        const int chain = 2 * ((e / 4) % 2);
        partial[chain] = fmaxf(partial[chain], s[e]);
        partial[chain + 1] = fmaxf(partial[chain + 1], s[e + 1]);
      }
      const float tile_max = fmaxf(fmaxf(partial[0], partial[1]), fmaxf(partial[2], partial[3]));
      // (The bias before the quad's reduction: it holds each thread's own first column.)
      const float new_max =
          fmaxf(max[i], quad_max(Biased ? tile_max + row_bias[i] : tile_max));
      const float offset = scaled_max(new_max, scale_log2);
      correction[i] = exp2_ftz(max[i] * scale_log2 - offset);  // 0 while max was -inf
      // (row_bias - max) before scaling: both may be large, their difference is not.
      const float shift =
          Biased ? (new_max == neg_inf() ? 0.f : (row_bias[i] - new_max) * scale_log2) : -offset;
      float tile_sum = 0.f;
#pragma unroll
      for (int e = 2 * i; e < N; e += 4) {
        s[e] = exp2_ftz(fmaf(s[e], scale_log2, shift));
        s[e + 1] = exp2_ftz(fmaf(s[e + 1], scale_log2, shift));
        tile_sum += s[e] + s[e + 1];
      }
      sum[i] = sum[i] * correction[i] + tile_sum;
      max[i] = new_max;
    }
  }

  // Capped scores in tanh units with a fixed offset instead of the running max (BoundedCap,
  // kMaxBoundedCap): no max, no correction; consume sets max to the offset after the last tile.
  // The sums are of P in fp32 here, or (SumHere false) of the bf16 fragments (add_bf16_sums).
  // FmaEighths of every 8 columns' exp2 run on the FMA pipe (exp2_fma; finite scores only: the
  // unmasked steps), the rest on the SFU.
  template <bool SumHere, int FmaEighths, int N>
  __device__ __forceinline__ void update_bounded(float (&s)[N], float c, float offset) {
    auto exp2_of = [&](int e, float x) {
      return (e / 4) % 8 < FmaEighths ? exp2_fma(x) : exp2_ftz(x);
    };
#pragma unroll
    for (int i = 0; i < 2; ++i) {
      float tile_sum = 0.f;
#pragma unroll
      for (int e = 2 * i; e < N; e += 4) {
        s[e] = exp2_of(e, fmaf(s[e], c, -offset));
        s[e + 1] = exp2_of(e, fmaf(s[e + 1], c, -offset));
        if constexpr (SumHere) tile_sum += s[e] + s[e + 1];
      }
      if constexpr (SumHere) sum[i] += tile_sum;
    }
  }
  // update_bounded's sums, of P as P·V takes it (bf16 fragments): no weight is exactly 1 here,
  // so a row of few keys is off by P's rounding when the sum takes P in fp32 (kBoundedSumsBf16).
  template <int K>
  __device__ __forceinline__ void add_bf16_sums(const unsigned (&pf)[K][4]) {
#pragma unroll
    for (int i = 0; i < 2; ++i) {
      float tile_sum = 0.f;
#pragma unroll
      for (int kk = 0; kk < K; ++kk)
#pragma unroll
        for (int r = i; r < 4; r += 2)
          tile_sum += __uint_as_float(pf[kk][r] << 16) + __uint_as_float(pf[kk][r] & 0xffff0000u);
      sum[i] += tile_sum;
    }
  }
};

// Soft-capped scores stay tanh(q·k · softcap_scale) (soft_cap_tanh_units), softcap joining the
// softmax's scale; not with ALiBi or a score_mod, which add to or read the capped scores, nor in
// 192-row paged tiles, where this form spilled 192-224 B (whole scores: 12-40 B).
template <bool Softcap, bool Alibi, int TileM, bool Paged>
inline constexpr bool kCapsInTanhUnits =
    Softcap && !Alibi && !user::kScoreMod && (TileM <= 128 || !Paged);

// Soft-capped scores in tanh units lie in [-1, 1]: with c = softcap · log2(e) at most
// kMaxBoundedCap (softcap <= 54.7: Gemma 2's 50 and Grok's 30 included), exp2(t · c - offset)
// for offset = max(0, c - 32) stays in [2^-126, 2^32] for every score, so no row needs its
// running max to stay finite and normal: no max, no correction, no O rescale. P then spans up to
// 2^32 and a row's sum up to 2^32 · keys, which fp32 and bf16 hold with room for any V (fp16
// does not: 16-bit P would flush). Larger caps take the running max.
constexpr float kMaxBoundedCap = 79.f;
__device__ __forceinline__ float bounded_cap_offset(float c) { return fmaxf(0.f, c - 32.f); }
// Where the bounded path sums P's bf16 fragments rather than P in fp32. 192-row causal tiles: the
// first rows' error reached 5.4e-3 of max |out| with fp32 sums (2.9e-3 with these; bench_variants,
// 32k causal d64). 128-row tiles keep fp32 sums, 3 % faster at d128 (1.28 against 1.32x plain)
// for 4.1e-3 against 2.5e-3, within the tests' bf16 bounds.
template <int TileM>
inline constexpr bool kBoundedSumsBf16 = TileM > 128;
// How many of every 8 columns' exp2 the bounded path takes on the FMA pipe (exp2_fma): d64's
// scores cost two SFU ops against half d128's GEMM time. 32k causal softcap 30 on the H100:
// d64 3 of 8 took 1.61 to 1.40x plain (2, 5 and 6 slower, degree 2 no faster; perf-log s42);
// d128 1 of 8 took 1.29 to 1.24x (2 and 3 gave 1.26-1.28x; perf-log s43); d256 unmeasured.
template <int HeadDim>
inline constexpr int kBoundedExp2FmaEighths = HeadDim == 64 ? 3 : HeadDim == 128 ? 1 : 0;

template <int N>
__device__ __forceinline__ void rescale_rows(float (&o)[N], const float (&correction)[2]) {
#pragma unroll
  for (int e = 0; e < N; ++e) o[e] *= correction[(e / 2) % 2];
}

// The S accumulator layout of 16 keys is exactly the A-fragment layout of a k16 slice of P, so
// P needs no shuffle: pack pairs to 16 bits, slice by slice.
template <typename T, int TileN>
__device__ __forceinline__ void probabilities_to_fragments(const float (&s)[TileN / 2],
                                                           unsigned (&p)[TileN / 16][4]) {
#pragma unroll
  for (int kk = 0; kk < TileN / 16; ++kk)
#pragma unroll
    for (int r = 0; r < 4; ++r) p[kk][r] = pack2<T>(s[8 * kk + 2 * r], s[8 * kk + 2 * r + 1]);
}

// Normalizes and writes this thread's part of O (and the rows' LSE), skipping rows past seqlen_q.
// A quad holds one 2-column word of each 8-column block of a row; a transpose over each 4 blocks
// gives every lane one whole block, stored as 16 bytes (O rows are 16-byte aligned: validate.cpp).
template <typename T, int HeadDim, bool Varlen, bool Sink>
__device__ __forceinline__ void store_output(const FmhaParams& p, const SequenceSpan& seq,
                                             const TileCoord& c, int row0,
                                             const FragmentPosition& at,
                                             const float (&o)[HeadDim / 2], RowSoftmax& softmax) {
  T* out = static_cast<T*>(p.o) + seq.q_batch * p.o_stride_b + seq.q_start * p.o_stride_s +
           c.head * p.o_stride_h;
#pragma unroll
  for (int i = 0; i < 2; ++i) {
    const RowFinish finish =
        finish_row<Sink>(p, c.head, softmax.max[i], quad_sum(softmax.sum[i]));
    const int row = row0 + at.row + 8 * i;
    const bool in_range = row < seq.seqlen_q;  // only the store: the shuffles need the whole warp
    const float scale = finish.scale;
    T* out_row = out + row * p.o_stride_s + 4 * at.col;  // lane q of a quad: block 4 g + q
#pragma unroll
    for (int g = 0; g < HeadDim / 32; ++g) {
      unsigned w[4];
#pragma unroll
      for (int k = 0; k < 4; ++k) {
        const int e = 4 * (4 * g + k) + 2 * i;
        w[k] = pack2<T>(o[e] * scale, o[e + 1] * scale);
      }
      quad_transpose(w);
      store_global_16(out_row + 32 * g, w, in_range);
    }
    if (in_range && p.lse != nullptr && at.col == 0)
      store_row_lse<Varlen>(p, c.batch, c.head, row, finish.lse(), seq.q_start);
  }
}

// O through shared memory, where Shape::kStageO. Each consumer warpgroup owns a slice of 64 rows,
// stored like Q: HeadDim / 64 boxes of [64 rows][128 bytes], 128-byte swizzled, which is what the
// O tensor map's store reads. The warpgroup writes its normalized rows there with stmatrix (each
// matrix row is one 16-byte chunk and the swizzle puts a matrix's 8 rows in 8 different chunks:
// no bank conflicts), then one thread copies the boxes out with TMA and the warpgroup goes on to
// its next tile. Rows past seqlen_q are clipped by the map: a varlen batch's map covers all its
// sequences, so a slice that ends past its sequence goes through store_output instead. LSE goes
// out as in store_output. The slice's named barrier also serves the warpgroup elsewhere.
template <typename T, int HeadDim, bool Varlen, bool Sink>
struct StagedOutput {
  // Named barriers 4..6, one per consumer warpgroup (0 is __syncthreads, Turns uses 1..3).
  static constexpr int kFirstBarrier = 4;
  static constexpr int kSliceBytes = 64 * HeadDim * 2;
  unsigned slice;  // shared-memory address of this warpgroup's slice
  int barrier;
  bool issuer;  // the thread that issues, commits and waits on the warpgroup's TMA stores

  __device__ __forceinline__ StagedOutput(unsigned o_base, int consumer)
      : slice(o_base + consumer * kSliceBytes),
        barrier(kFirstBarrier + consumer),
        issuer(threadIdx.x % kWarpgroupThreads == 0) {}

  __device__ __forceinline__ void store(const FmhaParams& p, const SequenceSpan& seq,
                                        const TmaDescriptor* tma_o, const TileCoord& c, int row0,
                                        const FragmentPosition& at, const float (&o)[HeadDim / 2],
                                        RowSoftmax& softmax) const {
    RowFinish finish[2];
    float scale[2];
#pragma unroll
    for (int i = 0; i < 2; ++i) {
      finish[i] = finish_row<Sink>(p, c.head, softmax.max[i], quad_sum(softmax.sum[i]));
      scale[i] = finish[i].scale;
    }
    // The previous tile's store must have read the slice before anyone overwrites it; the
    // barrier passes that on from the issuer, which alone can wait on its bulk groups.
    if (issuer) bulk_wait_group_read<0>();
    named_barrier_sync(barrier, kWarpgroupThreads);
    // stmatrix g covers 8-column blocks 2g and 2g + 1 of the warp's 16 rows as four matrices:
    // matrix m is block 2g + m / 2, rows 8 (m % 2) .. + 7, i.e. word 4g + m of each thread's o.
    // Lane l addresses row l % 8 of matrix l / 8; the swizzle puts chunk k of row r at k ^ (r % 8).
    const int lane = threadIdx.x % 32;
    const int row = 16 * ((threadIdx.x / 32) % 4) + 8 * ((lane / 8) % 2) + lane % 8;
    const unsigned lane_addr = slice + row * 128 + (((lane / 16) ^ (lane % 8)) << 4);
#pragma unroll
    for (int g = 0; g < HeadDim / 16; ++g) {
      unsigned w[4];
#pragma unroll
      for (int m = 0; m < 4; ++m) {
        const int e = 2 * (4 * g + m);
        w[m] = pack2<T>(o[e] * scale[m % 2], o[e + 1] * scale[m % 2]);
      }
      // Chunk 2g % 8 + lane / 16 of box g / 4; 2g % 8 is even, so adding lane / 16 is an XOR.
      stmatrix_x4((lane_addr ^ ((2 * g % 8) << 4)) + (g / 4) * 64 * 128, w);
    }
    fence_proxy_async_shared();
    named_barrier_sync(barrier, kWarpgroupThreads);
    if (issuer) {
#pragma unroll
      for (int b = 0; b < HeadDim / 64; ++b)
        tma_store_4d(tma_o, slice + b * 64 * 128, 64 * b, seq.q_start + row0, c.head, seq.q_batch);
      bulk_commit_group();
    }
    // LSE last: the proxy fence (a MEMBAR) would otherwise wait for these stores too.
#pragma unroll
    for (int i = 0; i < 2; ++i) {
      const int row = row0 + at.row + 8 * i;
      if (row < seq.seqlen_q && p.lse != nullptr && at.col == 0)
        store_row_lse<Varlen>(p, c.batch, c.head, row, finish[i].lse(), seq.q_start);
    }
  }

  // Kernel exit: the last stores must have completed (read the slice and written global memory).
  __device__ __forceinline__ void drain() const {
    if (issuer) bulk_wait_group<0>();
  }
};

// Zeros rows [first_row, TileN) of a K/V stage (all head-dim blocks; the swizzle only permutes
// chunks within a row) for the async proxy, then syncs the warpgroup on its named barrier.
template <int HeadDim, int TileN>
__device__ __forceinline__ void zero_rows(unsigned char* tile, int first_row, int barrier) {
  constexpr int kChunksPerRow = 128 / 16;
  const int chunks = (TileN - first_row) * kChunksPerRow;
  for (int i = threadIdx.x % kWarpgroupThreads; i < chunks * (HeadDim / 64);
       i += kWarpgroupThreads) {
    const int block = i / chunks, chunk = i - block * chunks;
    *reinterpret_cast<uint4*>(tile + (block * TileN + first_row) * 128 + chunk * 16) =
        make_uint4(0, 0, 0, 0);
  }
  fence_proxy_async_shared();
  named_barrier_sync(barrier, kWarpgroupThreads);
}

// One arrival per consumer warp tells the producer a stage (or Q) may be overwritten.
__device__ __forceinline__ void release(unsigned long long* bar) {
  if (threadIdx.x % 32 == 0) mbarrier_arrive(bar);
}

// Ping-pong between consumer warpgroups (FA3's scheduler barriers): a warpgroup issues its GEMMs
// only in its turn, then hands the turn on, so one warpgroup's softmax runs while another's GEMMs
// hold the tensor cores. Turn t of warpgroup c waits for turn t of c - 1 (consumer 0: turn t - 1
// of the last one); consumer 0 gives itself the first turn.
template <int Consumers>
struct Turns {
  static constexpr int kFirstBarrier = 1;                 // barrier 0 is __syncthreads
  static constexpr int kThreads = 2 * kWarpgroupThreads;  // the waiting and the handing warpgroup
  int consumer;

  __device__ __forceinline__ explicit Turns(int consumer_index) : consumer(consumer_index) {
    if (Consumers > 1 && consumer == 0) named_barrier_arrive(kFirstBarrier, kThreads);
  }
  __device__ __forceinline__ void begin() const {
    if (Consumers > 1) named_barrier_sync(kFirstBarrier + consumer, kThreads);
  }
  __device__ __forceinline__ void end() const {
    if (Consumers > 1) named_barrier_arrive(kFirstBarrier + (consumer + 1) % Consumers, kThreads);
  }
};

// ---- consumer main loop -----------------------------------------------------------------------

template <typename T, int HeadDim, int TileM, int TileN, int Stages, bool Causal, bool Varlen,
          bool Softcap, bool Window, bool Sink, bool Alibi, bool Paged, bool BlockMask,
          bool BoundedCap = false>
__device__ __forceinline__ void consume(const FmhaParams& p, const WgmmaSchedule& sched,
                                        const VarlenTable* table, const TmaDescriptor* tma_o,
                                        unsigned char* smem, PipelineBarriers<Stages>* bars,
                                        int consumer) {
  using Shape = WgmmaShape<HeadDim, TileM, TileN, Stages>;
  using Slices =
      WgmmaShape<HeadDim, TileM, TileN, Stages, Varlen, kCausalAlibi<Alibi, Causal, Softcap>>;
  constexpr bool kAlibiSlice = Slices::kAlibiSlice;
  const FragmentPosition at = fragment_position();
  // Shared-memory addresses are recomputed from one base where used: fewer live registers.
  const unsigned base = smem_u32(smem);
  const unsigned q_rows = base + Shape::kQOffset + consumer * 64 * Shape::kRowBytes;
  const int alibi_q_offset =
      Slices::kAlibiQOffset + consumer * 64 * WgmmaGeometry::kSliceRowBytes;
  const unsigned alibi_q = base + alibi_q_offset;
  const unsigned alibi_k = base + Slices::kAlibiKOffset;
  const Turns<Shape::kPingPong ? Shape::kConsumers : 1> turns(consumer);
  const StagedOutput<T, HeadDim, Varlen, Sink> staged(base + Shape::kOOffset, consumer);
  constexpr bool kCapUnits = kCapsInTanhUnits<Softcap, Alibi, TileM, Paged>;
  const float scale_log2 = kCapUnits ? p.scale_log2 * p.softcap : p.scale_log2;
  static_assert(!BoundedCap || kCapUnits, "bounded scores are capped ones in tanh units");
  const float bounded_offset = BoundedCap ? bounded_cap_offset(scale_log2) : 0.f;
  static_assert(StagedOutput<T, HeadDim, Varlen, Sink>::kFirstBarrier >= Turns<3>::kFirstBarrier + 3,
                "named barriers of the O stores and of the turns overlap");
  // Slot n of the K/V ring: stage n % Stages, completing its phase (n / Stages) & 1.
  auto k_tile = [&](int slot) {
    return base + Shape::kKOffset + (slot % Stages) * Shape::kKVBytes;
  };
  auto v_tile = [&](int slot) {
    return base + Shape::kVOffset + (slot % Stages) * Shape::kKVBytes;
  };
  auto wait_full = [&](unsigned long long* full, int slot) {
    mbarrier_wait(&full[slot % Stages], (slot / Stages) & 1);
  };
  constexpr bool kMayTake = kMayTakeUnits<Causal, Varlen, Paged, Softcap, Window, Sink, Alibi,
                                           BlockMask, HeadDim, TileM>;
  int pipe = 0, q_loads = 0;
  UnitSequence<Varlen, kMayTake, true> units(p, sched, table, &bars->units);
  for (int unit = units.next(); unit >= 0; unit = units.next()) {
    const WorkUnit<Causal, HeadDim, TileM, TileN, Varlen> u(p, sched, table, unit,
                                                            takes_units<kMayTake>(p, sched));
    // Only the lengths stay live through the main loop; the store looks the rows up again.
    const SequenceLengths seq = sequence_span<Varlen>(p, u.batch).lengths();
    for (int which = 0; which < u.tiles(); ++which) {
      const TileCoord c{u.m_block(which), u.head, u.batch};
      if (Varlen && c.m_block * TileM >= seq.seqlen_q) continue;  // as the producer skips it
      // The producer's order of key tiles (TileOrder); the i-th visited sits in ring slot
      // pipe + i. Without a window the order is the natural one, and the warpgroup's own rows
      // decide where its masked tiles start (one tile later for the second at most).
      TileVisits<Window, BlockMask> order =
          tile_visits<Causal, Window, BlockMask, TileM, TileN,
                      kShiftedBands<Window, Paged, Varlen, Alibi>>(seq, p, c.batch, c.head,
                                                                   c.m_block);
      const int row0 = c.m_block * TileM + consumer * 64;
      if (!Window)
        order.order.u1 =
            min(max(key_end<Causal, Window>(seq, p, row0), 0) / TileN, order.order.end);
      const int n_tiles = order.count();
      float o[HeadDim / 2];
#pragma unroll
      for (int e = 0; e < HeadDim / 2; ++e) o[e] = 0.f;
      RowSoftmax softmax;
      float s[TileN / 2], correction[2];
      unsigned pf[TileN / 16][4];
      const float alibi_slope = Alibi ? alibi_raw_slope(p, c.head) : 0.f;
      if constexpr (kAlibiSlice) {
        // The previous tile's Q·Kᵀ read the rows (every warp has waited on it) before they change,
        // and the generic proxy's writes reach wgmma's async proxy before anyone issues.
        named_barrier_sync(staged.barrier, kWarpgroupThreads);
        AlibiSlices::write_rows<T>(smem + alibi_q_offset, alibi_slope);
        fence_proxy_async_shared();
        named_barrier_sync(staged.barrier, kWarpgroupThreads);
      }
      // A score_mod needs each score whole: ALiBi's row part cannot wait for the softmax then.
      constexpr bool kRowBias = Alibi && Causal && !user::kScoreMod;
      // mask_mod's verdicts on the tile a masked step visits, taken before its S exists.
      auto user_mask = [&](int i, auto masked) {
        MaskBits<TileN / 2> bits{};
        if constexpr (decltype(masked)::value)
          bits = mask_mod_wgmma<TileN / 2>(p, c.batch, c.head, seq.seqlen_q, seq.seqlen_k,
                                           row0 + at.row, order.template key0<TileN>(i) + at.col);
        return bits;
      };
      // S -> P in place for the tile whose first key is key0, and O's correction.
      auto softmax_step = [&](int key0, auto masked, const MaskBits<TileN / 2>& hidden) {
        if constexpr (kCapUnits)
          soft_cap_tanh_units(s, p);
        else
          soft_cap<Softcap, /*Accurate=*/false>(s, p);
        scale_for_score_mod<Softcap>(s, p);
        [[maybe_unused]] float row_bias[2] = {0.f, 0.f};  // the bounded path has no max to bias
        if constexpr (Alibi) {
          // Row at.row's diagonal (bottom-right) counted from the tile's first key.
          const int diagonal = row0 + at.row + seq.seqlen_k - seq.seqlen_q - key0;
          if constexpr (kAlibiSlice) {  // slope · (key - tile start) is in s already
#pragma unroll
            for (int i = 0; i < 2; ++i)
              row_bias[i] = -alibi_slope * static_cast<float>(diagonal + 8 * i);
          } else {
            alibi_scores<kRowBias, TileN>(s, alibi_slope, diagonal - at.col, row_bias);
          }
        }
        score_mod_wgmma(s, p, c.batch, c.head, seq.seqlen_q, seq.seqlen_k, row0 + at.row,
                        key0 + at.col);
        if constexpr (decltype(masked)::value) {
          apply_mask_bits(s, hidden);
          mask_scores<Causal, Window, TileN>(s, seq, p, row0 + at.row, key0 + at.col);
        }
        if constexpr (BoundedCap)
          softmax.update_bounded<!kBoundedSumsBf16<TileM>,
                                 decltype(masked)::value ? 0 : kBoundedExp2FmaEighths<HeadDim>>(
              s, scale_log2, bounded_offset);
        else
          softmax.update<kRowBias>(s, scale_log2, correction, row_bias);
      };
      // P(j) into P·V's A fragments; the bounded path's bf16 sums are of those (kBoundedSumsBf16).
      auto p_to_fragments = [&] {
        probabilities_to_fragments<T, TileN>(s, pf);
        if constexpr (BoundedCap && kBoundedSumsBf16<TileM>) softmax.add_bf16_sums(pf);
      };
      // Steps take the visit index i (the tile is order.tile(i), its ring slot pipe + i).
      auto scores_alone = [&](int i, auto masked) {  // S(i), waited on, then softmax(i)
        const MaskBits<TileN / 2> hidden = user_mask(i, masked);
        wait_full(bars->k_full, pipe + i);
        turns.begin();
        issue_qk<T, HeadDim, TileM, TileN, kAlibiSlice>(s, q_rows, k_tile(pipe + i), alibi_q,
                                                        alibi_k);
        turns.end();
        wgmma_wait<0>();
        wgmma_fence_operands(s);
        // The tile's last Q·Kᵀ is done: the producer may load the next Q under softmax and P·V.
        if (i == n_tiles - 1) release(&bars->q_empty);
        release(&bars->k_empty[(pipe + i) % Stages]);
        softmax_step(order.template key0<TileN>(i), masked, hidden);
        if (!Shape::kRescaleUnderQk && !BoundedCap)
          rescale_rows(o, correction);  // else before P·V(i)
        p_to_fragments();
      };
      auto values_alone = [&](int i) {  // O += P(i)·V(i), waited on
        wait_full(bars->v_full, pipe + i);
        // With seqused_k or pages the rows past a sequence's last key may hold anything (NaN
        // included; runs of pages past it are not loaded at all), and P = 0 does not cancel NaN
        // in P·V: the last tile's rows past it become zeros (that tile is masked, so it is
        // visited last).
        const int key0 = order.template key0<TileN>(i);
        if ((Paged || (Varlen && p.seqused_k != nullptr)) && seq.seqlen_k - key0 < TileN)
          zero_rows<HeadDim, TileN>(
              smem + Shape::kVOffset + ((pipe + i) % Stages) * Shape::kKVBytes,
              seq.seqlen_k - key0, staged.barrier);
        if (Shape::kRescaleUnderQk && !BoundedCap)
          rescale_rows(o, correction);  // softmax(i)'s, before P·V(i)
        turns.begin();
        issue_pv<T, HeadDim, TileN>(o, pf, v_tile(pipe + i));
        turns.end();
        wgmma_wait<0>();
        wgmma_fence_operands(o);
        release(&bars->v_empty[(pipe + i) % Stages]);
      };
      // Intra-warpgroup overlap for visit i >= 1: S(i) = Q·K(i) and O += P(i-1)·V(i-1) are issued
      // together and softmax(i) runs while P·V is still on the tensor cores.
      auto overlapped_step = [&](int i, auto masked) {
        const int k_slot = pipe + i, v_slot = pipe + i - 1;
        const MaskBits<TileN / 2> hidden = user_mask(i, masked);
        wait_full(bars->k_full, k_slot);
        if (!Shape::kKeysAhead) wait_full(bars->v_full, v_slot);
        turns.begin();
        issue_qk<T, HeadDim, TileM, TileN, kAlibiSlice>(s, q_rows, k_tile(k_slot), alibi_q,
                                                        alibi_k);
        // Under Q·K(i): O (final through P·V(i - 2)) takes softmax(i - 1)'s correction.
        if (Shape::kRescaleUnderQk && !BoundedCap) rescale_rows(o, correction);
        if (Shape::kKeysAhead) wait_full(bars->v_full, v_slot);  // V(i - 1) lands behind K(i)
        issue_pv<T, HeadDim, TileN>(o, pf, v_tile(v_slot));
        turns.end();
        wgmma_wait<1>();  // S(i) is ready; P·V may still run
        wgmma_fence_operands(s);
        if (i == n_tiles - 1) release(&bars->q_empty);  // the tile's last Q·Kᵀ is done
        release(&bars->k_empty[k_slot % Stages]);
        softmax_step(order.template key0<TileN>(i), masked, hidden);
        wgmma_wait<0>();
        wgmma_fence_operands(o);
        wgmma_fence_operands(pf);  // P's registers stay reserved until P·V is done with them
        release(&bars->v_empty[v_slot % Stages]);
        if (!Shape::kRescaleUnderQk && !BoundedCap) rescale_rows(o, correction);
        p_to_fragments();
      };
      // Masked and unmasked tiles run in separate loops: a branch inside a step would split its
      // block, and ptxas then hoists the wait for P·V above the softmax.
      // The first order.unmasked() visits need no mask, the rest do.
      if (n_tiles > 0) {
        mbarrier_wait(&bars->q_full, q_loads++ & 1);
        const int unmasked = order.unmasked();
        if (unmasked == 0)
          scores_alone(0, True{});
        else
          scores_alone(0, False{});
        int i = 1;
        for (; i < unmasked; ++i) overlapped_step(i, False{});
        for (; i < n_tiles; ++i) overlapped_step(i, True{});
        values_alone(n_tiles - 1);
        pipe += n_tiles;
      }
      if constexpr (BoundedCap)  // the rows' offset in the same units (what the max would be)
        for (float& row_max : softmax.max) row_max = bounded_offset / scale_log2;
      if constexpr (kCapUnits)  // the LSE and a sink take the row maxima as scores (-inf stays)
        for (float& row_max : softmax.max) row_max *= p.softcap;
      const SequenceSpan rows = sequence_span<Varlen>(p, c.batch);
      if (Shape::kStageO && (!Varlen || p.cu_seqlens_q == nullptr || row0 + 64 <= rows.seqlen_q))
        staged.store(p, rows, tma_o, c, row0, at, o, softmax);
      else
        store_output<T, HeadDim, Varlen, Sink>(p, rows, c, row0, at, o, softmax);
    }
  }
  if constexpr (Shape::kStageO) staged.drain();
}

// ---- kernel -----------------------------------------------------------------------------------

// Paged: K and V come from a paged cache (FmhaParams::page_table) through maps over its pages.
// BlockMask: the entry that reads a block mask (FmhaParams::block_*), compiled beside the other
// for variants with a mask_mod.
template <typename T, int HeadDim, int TileM, int TileN, int Stages, bool Causal, bool Varlen,
          bool Softcap, bool Window, bool Sink, bool Alibi, bool Paged, bool BlockMask = false>
__global__ void __launch_bounds__(WgmmaShape<HeadDim, TileM, TileN, Stages>::kThreads, 1)
    fmha_wgmma_kernel(const FmhaParams p, const __grid_constant__ TmaDescriptor tma_q,
                      const __grid_constant__ TmaDescriptor tma_k,
                      const __grid_constant__ TmaDescriptor tma_v,
                      const __grid_constant__ TmaDescriptor tma_o, const WgmmaSchedule sched) {
  begin_after_previous_grid();
  using Shape =
      WgmmaShape<HeadDim, TileM, TileN, Stages, Varlen, kCausalAlibi<Alibi, Causal, Softcap>>;
  extern __shared__ unsigned char smem_raw[];
  // The 128B swizzle pattern repeats every 1024 bytes and wgmma assumes atoms start on that grid.
  unsigned char* smem = smem_raw + ((1024 - smem_u32(smem_raw) % 1024) % 1024);
  auto* bars = reinterpret_cast<PipelineBarriers<Stages>*>(smem + Shape::kBarrierOffset);
  auto* table = reinterpret_cast<VarlenTable*>(smem + Shape::kTableOffset);
  constexpr unsigned kConsumerWarps = Shape::kConsumers * 4;
  constexpr bool kMayTake = kMayTakeUnits<Causal, Varlen, Paged, Softcap, Window, Sink, Alibi,
                                           BlockMask, HeadDim, TileM>;
  static_assert(sizeof(PipelineBarriers<Stages>) == Shape::kBarrierBytes, "barrier bytes");
  static_assert(!BlockMask || user::kMaskMod, "block masks come with a mask_mod");
  if (Varlen && sched.sorted_varlen)  // the K ring is free until the producer starts
    build_varlen_table<Causal, TileM, TileN>(p, table,
                                             reinterpret_cast<int*>(smem + Shape::kKOffset));

  if (threadIdx.x == 0) {
    // A gathered stage is full once each producer thread's copies have landed (cp.async's
    // arrivals), a TMA-loaded one once its bytes have (one arrival, with the byte count).
    const unsigned kv_arrivals = Paged && sched.gather_pages ? kWarpgroupThreads : 1;
    mbarrier_init(&bars->q_full, 1);
    mbarrier_init(&bars->q_empty, kConsumerWarps);
    for (int s = 0; s < Stages; ++s) {
      mbarrier_init(&bars->k_full[s], kv_arrivals);
      mbarrier_init(&bars->v_full[s], kv_arrivals);
      mbarrier_init(&bars->k_empty[s], kConsumerWarps);
      mbarrier_init(&bars->v_empty[s], kConsumerWarps);
    }
    if constexpr (kMayTake) {
      mbarrier_init(&bars->units.full, 1);
      mbarrier_init(&bars->units.empty, kConsumerWarps + 1);  // and the producer thread
    }
    mbarrier_init_fence();
    tma_prefetch_descriptor(&tma_q);
    tma_prefetch_descriptor(&tma_k);
    tma_prefetch_descriptor(&tma_v);
    if constexpr (Shape::kStageO) tma_prefetch_descriptor(&tma_o);
  }
  if constexpr (Shape::kAlibiSlice) {
    AlibiSlices::write_keys<T, TileN, Shape::kThreads>(smem + Shape::kAlibiKOffset);
    fence_proxy_async_shared();  // before the barrier: wgmma reads them through the async proxy
  }
  __syncthreads();

  // Read through a shuffle so the compiler knows it is warp-uniform: the consumers' Q descriptors
  // then live in uniform registers.
  const int warpgroup = __shfl_sync(0xffffffffu, threadIdx.x / kWarpgroupThreads, 0);
  if (warpgroup == 0) {
    warpgroup_lower_registers<Shape::template kProducerRegs<Paged>>();
    // Separate instantiations for gathered and TMA-loaded pages: sharing one register
    // allocation, the two made the 24-40-register producer spill.
    bool gathered = false;
    if constexpr (Paged) {
      if (sched.gather_pages) {
        produce<T, HeadDim, TileM, TileN, Stages, Causal, Varlen, Window, BlockMask, true, true,
                false, false>(p, sched, table, &tma_q, &tma_k, &tma_v, smem, bars);
        gathered = true;
      }
    }
    if (!gathered && threadIdx.x < (Paged ? 32 : 1))
      produce<T, HeadDim, TileM, TileN, Stages, Causal, Varlen, Window, BlockMask, Paged, false,
              kMayTake, kShiftedBands<Window, Paged, Varlen, Alibi>>(p, sched, table, &tma_q,
                                                                     &tma_k, &tma_v, smem, bars);
    if (threadIdx.x == 32 && takes_units<kMayTake>(p, sched))
      schedule_units<TileM>(p, sched, &bars->units);
  } else {
    warpgroup_raise_registers<Shape::template kConsumerRegs<Paged>>();
    // bf16 soft-capped scores in tanh units with a cap of at most kMaxBoundedCap take the
    // consumer without a running max (a second copy of it in these kernels); not in non-causal
    // 192-row tiles or at d256, where the two copies spilled (244 B at d64 192 x 128 x 3, 8-92 B
    // at d256).
    if constexpr (kCapsInTanhUnits<Softcap, Alibi, TileM, Paged> && kIsBf16<T> &&
                  (TileM <= 128 || Causal) && HeadDim <= 128) {
      if (p.softcap * p.scale_log2 <= kMaxBoundedCap) {
        consume<T, HeadDim, TileM, TileN, Stages, Causal, Varlen, Softcap, Window, Sink, Alibi,
                Paged, BlockMask, true>(p, sched, table, &tma_o, smem, bars, warpgroup - 1);
        return;
      }
    }
    consume<T, HeadDim, TileM, TileN, Stages, Causal, Varlen, Softcap, Window, Sink, Alibi, Paged,
            BlockMask>(
        p, sched, table, &tma_o, smem, bars, warpgroup - 1);
  }
}

}  // namespace flashjit

// Which query tiles a CTA of the persistent wgmma kernel works on, and in what order.
//
// A work unit is one query tile, or for causal attention the pair of tiles k and m - 1 - k of one
// (sequence, head), m being the sequence's query tiles: long + short costs the same for every k.
// CTA c takes one unit per round of gridDim.x units (dealt_unit), or as it frees up
// (schedule_units).
// - Dense batches: every (batch, head) pair has the same units, and a pair's units are
//   consecutive, so the CTAs running together share few pairs' K/V and read each from DRAM about
//   once. (Pairs changing fastest within L2-sized groups read 354 MB for b32 h16 s512 d128's
//   268 MB of q, k, v and o, one pair's units a round apart, and ran 0.85x cuDNN at 512 tokens;
//   this order reads 259 MB, 0.99x: docs/perf-log.md, session 34.) GQA's query heads of one KV
//   head are adjacent pairs.
// - Plain dense causal batches of may_take_units' kernels whose units leave the last round part
//   empty, with FmhaParams::tile_counter (WgmmaSchedule::lpt_group_pairs > 0): d128 / d256 in
//   128-row tiles under two rounds (b2 h8 s3001 d256: 192 units, 1.45 rounds of 132; b3 h16
//   777 x 1531 d128), d64 in 192-row tiles with 1/50 or more of the unit slots idle (b1 h32 s16k:
//   1376 units, 10.4 rounds, ~5 % idle). The units of the pairs before taken_from_pair (up to
//   about a round before the end; none under two rounds) go round-robin as above; the remaining
//   pairs' tiles are units of one tile each, costliest first within groups of pairs, and each
//   CTA takes the next from a counter in device memory as it frees up (schedule_units): greedy,
//   longest first, the last units the cheapest. The host sizes a group so its K/V fit half of L2
//   and the CTAs running at once hold several tiles of each of its pairs (they read the pair's
//   K/V in step). Dealt statically instead, such tiles lost 7-38 % (costs fall in a sawtooth
//   across a round where the group's tiles are not many rounds long: docs/perf-log.md, session
//   35). Without a counter (in a CUDA graph, on the per-thread default stream:
//   Workspaces::get_stream_ordered) the pairs of tiles go round-robin.
// - Varlen variants (a varlen batch or seqused_k) of at most kMaxSortedSequences sequences: each
//   CTA first sorts the sequences by the cost of one of their units, most expensive first, into a
//   table in shared memory; units then go sequence by sequence in that order, head by head, k
//   fastest. Dealing units in order of decreasing cost keeps the CTAs within one unit of each other
//   (longest processing time first), where batch order can leave a CTA holding the last long
//   sequence alone.
// - Larger varlen batches: the dense order over the longest sequence's tiles; tiles past a
//   sequence's end are skipped.
#pragma once

#include "common/grouped_order.cuh"
#include "common/masking.cuh"
#include "common/params.cuh"
#include "common/sequence.cuh"
#include "common/sm90_mbarrier.cuh"
#include "common/user_scores.cuh"
#include "wgmma/shape.cuh"

namespace flashjit {

struct VarlenTable {
  int units_end[WgmmaGeometry::kMaxSortedSequences];            // by rank: units of the ranks <= r
  unsigned short sequence[WgmmaGeometry::kMaxSortedSequences];  // by rank: the batch index
};
static_assert(sizeof(VarlenTable) == WgmmaGeometry::kTableBytes, "table bytes");

// One sequence's work units and what one of them costs (key tiles plus one per query tile, the
// epilogue's share).
template <bool Causal, int TileM, int TileN>
struct SequenceUnits {
  int query_tiles, per_head;

  __device__ __forceinline__ explicit SequenceUnits(const SequenceSpan& seq)
      : query_tiles((seq.seqlen_q + TileM - 1) / TileM),
        per_head(Causal ? (query_tiles + 1) / 2 : query_tiles) {}

  __device__ __forceinline__ int cost(const SequenceSpan& seq) const {
    if (query_tiles == 0) return 0;
    const int first = kv_tile_count<Causal, TileM, TileN>(seq, 0) + 1;
    if (!Causal || query_tiles == 1) return first;
    return first + kv_tile_count<Causal, TileM, TileN>(seq, (query_tiles - 1) * TileM) + 1;
  }
};

// Builds the table; every thread of the CTA calls it, and a __syncthreads must follow before the
// table is read. `scratch` holds 2 * kMaxSortedSequences ints (the K/V ring, not yet in use).
template <bool Causal, int TileM, int TileN>
__device__ __forceinline__ void build_varlen_table(const FmhaParams& p, VarlenTable* table,
                                                   int* scratch) {
  int* cost = scratch;
  int* units = scratch + WgmmaGeometry::kMaxSortedSequences;
  for (int b = threadIdx.x; b < p.batch; b += blockDim.x) {
    const SequenceSpan seq = sequence_span(p, b);
    const SequenceUnits<Causal, TileM, TileN> su(seq);
    cost[b] = su.cost(seq);
    units[b] = su.per_head * p.heads_q;
  }
  __syncthreads();
  for (int b = threadIdx.x; b < p.batch; b += blockDim.x) {  // rank: costlier first, ties in order
    int rank = 0;
    for (int other = 0; other < p.batch; ++other)
      rank += cost[other] > cost[b] || (cost[other] == cost[b] && other < b);
    table->sequence[rank] = static_cast<unsigned short>(b);
  }
  __syncthreads();
  for (int rank = threadIdx.x; rank < p.batch; rank += blockDim.x) {
    int end = 0;
    for (int r = 0; r <= rank; ++r) end += units[table->sequence[r]];
    table->units_end[rank] = end;
  }
}

// may_take_units (wgmma/shape.cuh) of a variant, and whether this launch's CTAs take units.
template <bool Causal, bool Varlen, bool Paged, bool Softcap, bool Window, bool Sink, bool Alibi,
          bool BlockMask, int HeadDim, int TileM>
constexpr bool kMayTakeUnits =
    may_take_units(Causal, Varlen, Paged,
                   Softcap || Window || Sink || Alibi || BlockMask || kUserFunctions, HeadDim,
                   TileM);

template <bool MayTake>
__device__ __forceinline__ bool takes_units(const FmhaParams& p, const WgmmaSchedule& s) {
  return MayTake && s.lpt_group_pairs > 0 && p.tile_counter != nullptr;
}

template <bool Varlen>
__device__ __forceinline__ int total_units(const FmhaParams& p, const WgmmaSchedule& s,
                                           const VarlenTable* table) {
  return Varlen && s.sorted_varlen ? table->units_end[p.batch - 1] : s.total_units;
}

// The unit CTA blockIdx.x takes in its round n of gridDim.x units: c, c + grid, ... in dense
// order; with the sorted table the rounds alternate direction (c, 2 grid - 1 - c, 2 grid + c, ...),
// so the CTA that took the costliest unit of one round takes the cheapest of the next and the
// CTAs stay within about one unit's cost of each other overall, not one unit per round.
template <bool Varlen>
__device__ __forceinline__ int dealt_unit(const WgmmaSchedule& s, int round) {
  const bool backwards = Varlen && s.sorted_varlen && (round & 1);
  return round * gridDim.x + (backwards ? gridDim.x - 1 - blockIdx.x : blockIdx.x);
}

// Dense causal batches that take units (takes_units): one thread of the producer warpgroup (warp
// 1's first, idle otherwise) schedules the CTA's units: it hands them one at a time, through a
// one-unit slot in shared memory, to the producer thread and the consumer warps (-1 past the
// last ends their loops), so they hold no schedule state across a unit (the 24-register producer
// spilled it). First the CTA's dealt units (c, c + grid, ... below dealt_bound), then single
// tiles t (c first, then each next from tile_counter[0] + grid), published as dealt_bound + t,
// each taken once the consumers have the unit before and the producer, its loads issued, asks
// for the next (UnitSequence::next): a CTA claims a tile shortly before it frees up, so the
// last, cheapest units go to the CTAs that free up first (greedy, longest first). Past the end,
// it counts its CTA done in tile_counter[1]; the last CTA to do so has seen every CTA's last
// fetch and zeroes both for the stream's next launch (which waits for this grid to complete:
// begin_after_previous_grid).
struct UnitRing {
  unsigned long long full, empty;
  int unit, unused;
};

// The pairs dealt before tiles are taken, and their units (deals_before_taking's tiles only:
// elsewhere the state spilled, d128 8 -> 24 B, d256 16 -> 44 B).
template <int TileM>
__device__ __forceinline__ int dealt_pairs(const WgmmaSchedule& s) {
  return deals_before_taking(TileM) ? s.taken_from_pair : 0;
}
template <int TileM>
__device__ __forceinline__ int dealt_bound(const WgmmaSchedule& s) {
  return dealt_pairs<TileM>(s) * s.units_per_pair;
}

template <int TileM>
__device__ __forceinline__ void schedule_units(const FmhaParams& p, const WgmmaSchedule& s,
                                               UnitRing* ring) {
  const int bound = dealt_bound<TileM>(s);
  const int tiles = s.m_tiles * (p.batch * p.heads_q - dealt_pairs<TileM>(s));
  // One atomic fewer a CTA: every first tile from the counter, 777 x 1531 d128 ran 1.3 % slower.
  bool first_taken = true;
  for (int n = 0;; ++n) {
    mbarrier_wait(&ring->empty, (n & 1) ^ 1);  // every reader has unit n - 1
    int unit = dealt_unit<false>(s, n);
    if (unit >= bound) {
      const int t = first_taken ? static_cast<int>(blockIdx.x)
                                : atomicAdd(p.tile_counter, 1) + static_cast<int>(gridDim.x);
      first_taken = false;
      unit = t < tiles ? bound + t : -1;
    }
    ring->unit = unit;
    mbarrier_arrive(&ring->full);  // release: the readers see the word
    if (unit < 0) break;
  }
  __threadfence();  // the last fetch comes before the count
  if (atomicAdd(p.tile_counter + 1, 1) == static_cast<int>(gridDim.x) - 1) {
    atomicExch(p.tile_counter, 0);
    atomicExch(p.tile_counter + 1, 0);
  }
}

// A role's walk over the CTA's units: next() is the next one, -1 past the last. Where the CTAs
// take units (takes_units), from the scheduler's slot (the producer thread, Warp false, or a
// consumer warp, which frees the slot once all its lanes have it); the others deal them here
// (through the slot, dealt causal and non-causal units measured 1-3 % slower: session 36). In
// causal dense variants the producer's dealt walk spills 4-8 B (one local load a unit).
template <bool Varlen, bool MayTake, bool Warp>
struct UnitSequence {
  const FmhaParams& p;
  const WgmmaSchedule& s;
  UnitRing* ring;
  int units;  // dealt ones
  int n = 0;

  __device__ __forceinline__ UnitSequence(const FmhaParams& p, const WgmmaSchedule& s,
                                          const VarlenTable* table, UnitRing* ring)
      : p(p), s(s), ring(ring), units(total_units<Varlen>(p, s, table)) {}
  __device__ __forceinline__ int next() {
    if (!takes_units<MayTake>(p, s)) {
      const int unit = dealt_unit<Varlen>(s, n++);
      return unit < units ? unit : -1;
    }
    // The producer frees the slot only when it asks for the next unit (its loads of this one
    // issued, a key tile or two before the consumers finish it), so the scheduler claims each
    // tile then, not when the unit before starts: claimed a whole tile early, the tiles went
    // out in the order the CTAs started their previous ones, not the order they would free up
    // (b2 h8 3001 d256 causal: CTAs ended 70-139 us into a 139 us launch; docs/perf-log.md,
    // session 39).
    if (!Warp && n > 0) mbarrier_arrive(&ring->empty);
    mbarrier_wait(&ring->full, n & 1);
    const int unit = *static_cast<volatile int*>(&ring->unit);
    if (Warp) {
      __syncwarp();
      if (threadIdx.x % 32 == 0) mbarrier_arrive(&ring->empty);
    }
    ++n;
    return unit;
  }
};

// Whether a causal pair's short tile goes first, so the long one finds its K/V tiles in L2.
// Long first, the short tile re-reads them after the long one's whole sweep: at d256 the pairs
// the CTAs hold at once (2 x 132 x 128 rows x d256 x K and V: 35 MB) outgrow L2 during it, so
// the re-reads come from DRAM (b32 h8 512 causal read 258 MB for 201 MB of q, k and v; short
// first 214 MB), which is the bound at short sequences. H100, x cuDNN (perf-log session 43):
// short first at d256 512 / 1k / 2k / 4k / 8k +7.7 / +2.7 / +0.4 / 0 / -1.8 %, at d128 512 /
// 1k / 2k -2.8 / -2.4 / -1.4 %; this rule, session 44: d256 512 +7.4 %, 1k +2.6 %, 8k 0.
FLASHJIT_HOST_DEVICE constexpr bool short_tile_first(int head_dim, int query_tiles) {
  return head_dim >= 256 && query_tiles <= 8;
}

template <bool Causal, int HeadDim, int TileM, int TileN, bool Varlen>
struct WorkUnit {
  int k, head, batch;
  int query_tiles;  // of this unit's sequence (dense and unsorted: the longest's)
  bool single = false;  // one tile (takes_units)

  __device__ __forceinline__ WorkUnit(const FmhaParams& p, const WgmmaSchedule& s,
                                      const VarlenTable* table, int unit, bool taking) {
    if (Varlen && s.sorted_varlen) {
      int lo = 0, hi = p.batch - 1;  // the first rank whose units end past `unit`
      while (lo < hi) {
        const int mid = (lo + hi) / 2;
        if (table->units_end[mid] > unit)
          hi = mid;
        else
          lo = mid + 1;
      }
      batch = table->sequence[lo];
      const int first = lo > 0 ? table->units_end[lo - 1] : 0;
      const SequenceUnits<Causal, TileM, TileN> su(sequence_span(p, batch));
      const int v = unit - first;
      head = v / su.per_head;
      k = v - head * su.per_head;
      query_tiles = su.query_tiles;
      return;
    }
    int pair;
    if (Causal && taking && unit >= dealt_bound<TileM>(s)) {  // tile m_tiles - 1 - k of a pair
      const int first = dealt_pairs<TileM>(s);
      const GroupedTile at = grouped_tile(unit - dealt_bound<TileM>(s), s.m_tiles,
                                          p.batch * p.heads_q - first, s.lpt_group_pairs);
      k = at.rank;
      pair = first + at.pair;
      single = true;  // m_block(0) is tile m_tiles - 1 - k
    } else {
      pair = unit / s.units_per_pair;
      k = unit - pair * s.units_per_pair;
    }
    head = pair % p.heads_q;
    batch = pair / p.heads_q;
    query_tiles = s.m_tiles;
  }
  __device__ __forceinline__ int tiles() const {
    return Causal && !single && 2 * k + 1 != query_tiles ? 2 : 1;  // an odd middle tile once
  }
  // The long tile of a pair first, or the short one (short_tile_first); a taken single tile is
  // its pair's long one.
  __device__ __forceinline__ int m_block(int which) const {
    const bool long_tile = single || (which == 0) != short_tile_first(HeadDim, query_tiles);
    return Causal && long_tile ? query_tiles - 1 - k : k;
  }
};

}  // namespace flashjit

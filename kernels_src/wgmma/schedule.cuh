// Which query tiles a CTA of the persistent wgmma kernel works on, and in what order.
//
// A work unit is one query tile, or for causal attention the pair of tiles k and m - 1 - k of one
// (sequence, head), m being the sequence's query tiles: long + short costs the same for every k.
// CTA c takes one unit per round of gridDim.x units (UnitCursor).
// - Dense batches: every (batch, head) pair has the same units, and a pair's units are
//   consecutive, so the CTAs running together share few pairs' K/V and read each from DRAM about
//   once. (Pairs changing fastest within L2-sized groups read 354 MB for b32 h16 s512 d128's
//   268 MB of q, k, v and o, one pair's units a round apart, and ran 0.85x cuDNN at 512 tokens;
//   this order reads 259 MB, 0.99x: docs/perf-log.md, session 34.) GQA's query heads of one KV
//   head are adjacent pairs.
// - Varlen variants (a varlen batch or seqused_k) of at most kMaxSortedSequences sequences: each
//   CTA first sorts the sequences by the cost of one of their units, most expensive first, into a
//   table in shared memory; units then go sequence by sequence in that order, head by head, k
//   fastest. Dealing units in order of decreasing cost keeps the CTAs within one unit of each other
//   (longest processing time first), where batch order can leave a CTA holding the last long
//   sequence alone.
// - Larger varlen batches: the dense order over the longest sequence's tiles; tiles past a
//   sequence's end are skipped.
#pragma once

#include "common/masking.cuh"
#include "common/params.cuh"
#include "common/sequence.cuh"
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

template <bool Varlen>
__device__ __forceinline__ int total_units(const FmhaParams& p, const WgmmaSchedule& s,
                                           const VarlenTable* table) {
  return Varlen && s.sorted_varlen ? table->units_end[p.batch - 1] : s.total_units;
}

// The units of CTA blockIdx.x: c, c + grid, ... in dense order; with the sorted table the rounds
// alternate direction (c, 2 grid - 1 - c, 2 grid + c, ...), so the CTA that took the costliest
// unit of one round takes the cheapest of the next and the CTAs stay within about one unit's
// cost of each other overall, not one unit per round.
template <bool Varlen>
struct UnitCursor {
  int round = 0, unit;
  bool snake;

  __device__ __forceinline__ explicit UnitCursor(const WgmmaSchedule& s)
      : unit(blockIdx.x), snake(Varlen && s.sorted_varlen) {}
  __device__ __forceinline__ void next() {
    if (!Varlen || !snake) {
      unit += gridDim.x;
      return;
    }
    ++round;
    unit = round * gridDim.x + ((round & 1) ? gridDim.x - 1 - blockIdx.x : blockIdx.x);
  }
};

template <bool Causal, int TileM, int TileN, bool Varlen>
struct WorkUnit {
  int k, head, batch;
  int query_tiles;  // of this unit's sequence (dense and unsorted: the longest's)

  __device__ __forceinline__ WorkUnit(const FmhaParams& p, const WgmmaSchedule& s,
                                      const VarlenTable* table, int unit) {
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
    const int pair = unit / s.units_per_pair;
    k = unit - pair * s.units_per_pair;
    head = pair % p.heads_q;
    batch = pair / p.heads_q;
    query_tiles = s.m_tiles;
  }
  __device__ __forceinline__ int tiles() const {
    return Causal && 2 * k + 1 != query_tiles ? 2 : 1;  // an odd middle tile comes once
  }
  __device__ __forceinline__ int m_block(int which) const {
    return Causal && which == 0 ? query_tiles - 1 - k : k;  // the long tile first
  }
};

}  // namespace flashjit

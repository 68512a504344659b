// How the roles of a dK/dV CTA (bwd_wgmma/kernel.cu) learn which key tiles they work on: dealt
// (CTA b takes tiles b, b + grid, ...) or taken from a counter as the CTA frees up.
//
// Causal key tiles cost from one query step to all of them, so a dealt persistent walk leaves
// its CTAs unequal, and one CTA a tile (the hardware's greedy order) pays a CTA's start (barrier
// setup, K, V and the first Q load, the pipeline's fill) once a tile. Taken tiles get both: one
// CTA an SM loading its next tile while it finishes the last, and a greedy order over the
// launch's tiles (heaviest first within groups of pairs, BwdKeyTileOrder: the last tiles are
// the cheapest). The counter lives in the backward's workspace (BackwardParams::tile_counter),
// zeroed by bwd_prep, which runs before every dK/dV launch that has one, so a CUDA graph replays
// it too.
#pragma once

#include "common/params.cuh"
#include "common/sm90_mbarrier.cuh"

namespace flashjit {

// The one-tile slot the scheduler thread publishes each next tile through (-1: past the last).
struct KeyTileSlot {
  unsigned long long full, empty;
  int linear, unused;
};

// Causal launches with a counter take their tiles; the rest are dealt. Each role tests it for
// itself: tested before the roles split, the value was live across warpgroup 0's setmaxnreg,
// which ptxas then ignored (the consumers spilled 1.5-2 KB).
template <bool Causal>
__device__ __forceinline__ bool takes_key_tiles(const BackwardParams& p) {
  return Causal && p.tile_counter != nullptr;
}

// The scheduler (one thread of the producer warpgroup): tile n + 1 is claimed once every reader
// has tile n, the producer counting as having it only when it asks for n + 1 (its loads of n
// issued, KeyTileSequence::next): a tile or so before the CTA frees up. Claimed earlier (when the
// consumers start the tile before), the tiles go out in the order the CTAs started their last
// ones, not the order they free up (the forward's lesson, docs/perf-log.md, session 39).
__device__ __forceinline__ void schedule_key_tiles(const BackwardParams& p, int total,
                                                   KeyTileSlot* slot) {
  for (int n = 0;; ++n) {
    mbarrier_wait(&slot->empty, (n & 1) ^ 1);
    const int t = n == 0 ? static_cast<int>(blockIdx.x)
                         : atomicAdd(p.tile_counter, 1) + static_cast<int>(gridDim.x);
    slot->linear = t < total ? t : -1;
    mbarrier_arrive(&slot->full);  // release: the readers see the word
    if (t >= total) return;
  }
}

// A role's walk over the launch's `total` tiles: first(), then next() until -1. Readers are
// whole warps; the producer's warp (Deferred) frees the slot when it asks for the next tile, the
// others when they have read it. It holds one int: the consumers keep it beside ~240 registers of
// accumulators, so whether it takes, the total and the slot are read again at each use.
template <bool Causal, bool Deferred>
struct KeyTileSequence {
  const BackwardParams& p;
  KeyTileSlot* slot;
  int position = 0;  // dealt: the current tile; taken: the slot's reads so far

  __device__ __forceinline__ int first(int total) {
    if (takes_key_tiles<Causal>(p)) return read();
    position = static_cast<int>(blockIdx.x);
    return position < total ? position : -1;
  }
  __device__ __forceinline__ int next(int total) {
    if (!takes_key_tiles<Causal>(p)) {
      position += static_cast<int>(gridDim.x);
      return position < total ? position : -1;
    }
    if (Deferred) free_slot();
    return read();
  }

 private:
  __device__ __forceinline__ void free_slot() {
    __syncwarp();
    if (threadIdx.x % 32 == 0) mbarrier_arrive(&slot->empty);
  }
  __device__ __forceinline__ int read() {
    mbarrier_wait(&slot->full, position & 1);
    ++position;
    const int unit = *static_cast<volatile int*>(&slot->linear);
    if (!Deferred) free_slot();
    return unit;
  }
};

}  // namespace flashjit

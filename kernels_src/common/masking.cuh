// Which keys a query row may see, and which key tiles a query tile must visit.
// Causal masks are aligned bottom-right (FlashAttention): query i sees key j iff
// j <= i + (seqlen_k - seqlen_q). Out-of-range keys (j >= seqlen_k) are always masked.
#pragma once

#include "common/params.cuh"

namespace flashjit {

// One past the last key that query row `row` may see (may be <= 0: the row sees nothing).
template <bool Causal>
__device__ __forceinline__ int key_limit(const FmhaParams& p, int row) {
  if (!Causal) return p.seqlen_k;
  int limit = row + 1 + p.seqlen_k - p.seqlen_q;
  return limit < p.seqlen_k ? limit : p.seqlen_k;
}

// Key tiles [0, n_tiles) hold every key some row of [row0, row0 + TileM) may see; tiles above the
// diagonal are never visited.
template <bool Causal, int TileM, int TileN>
__device__ __forceinline__ int kv_tile_count(const FmhaParams& p, int row0) {
  int last_row = row0 + TileM - 1;
  if (last_row > p.seqlen_q - 1) last_row = p.seqlen_q - 1;
  int keys = key_limit<Causal>(p, last_row);
  return keys <= 0 ? 0 : (keys + TileN - 1) / TileN;
}

// True when some (row, key) pair of the tile is masked, so the mask must be applied;
// interior tiles skip the per-element compare.
template <bool Causal, int TileM, int TileN>
__device__ __forceinline__ bool tile_needs_mask(const FmhaParams& p, int row0, int key0) {
  if (key0 + TileN > p.seqlen_k) return true;
  return Causal && key0 + TileN > key_limit<Causal>(p, row0);
}

}  // namespace flashjit

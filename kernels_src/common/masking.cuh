// Which keys a query row may see, and which key tiles a query tile must visit.
// Causal masks are aligned bottom-right (FlashAttention): query i sees key j iff
// j <= i + (seqlen_k - seqlen_q). Out-of-range keys (j >= seqlen_k) are always masked.
// `Lengths` is anything with seqlen_q and seqlen_k: the launch's FmhaParams (dense batches) or one
// sequence's SequenceSpan (common/sequence.cuh).
#pragma once

namespace flashjit {

// One past the last key that query row `row` may see (may be <= 0: the row sees nothing).
template <bool Causal, typename Lengths>
__device__ __forceinline__ int key_limit(const Lengths& len, int row) {
  if (!Causal) return len.seqlen_k;
  int limit = row + 1 + len.seqlen_k - len.seqlen_q;
  return limit < len.seqlen_k ? limit : len.seqlen_k;
}

// Key tiles [0, n_tiles) hold every key some row of [row0, row0 + TileM) may see; tiles above the
// diagonal are never visited.
template <bool Causal, int TileM, int TileN, typename Lengths>
__device__ __forceinline__ int kv_tile_count(const Lengths& len, int row0) {
  int last_row = row0 + TileM - 1;
  if (last_row > len.seqlen_q - 1) last_row = len.seqlen_q - 1;
  int keys = key_limit<Causal>(len, last_row);
  return keys <= 0 ? 0 : (keys + TileN - 1) / TileN;
}

// True when some (row, key) pair of the tile is masked, so the mask must be applied;
// interior tiles skip the per-element compare.
template <bool Causal, int TileM, int TileN, typename Lengths>
__device__ __forceinline__ bool tile_needs_mask(const Lengths& len, int row0, int key0) {
  if (key0 + TileN > len.seqlen_k) return true;
  return Causal && key0 + TileN > key_limit<Causal>(len, row0);
}

}  // namespace flashjit

// Which keys a query row may see, and which key tiles a query tile must visit.
// Causal masks are aligned bottom-right (FlashAttention): query i sees key j iff
// j <= i + (seqlen_k - seqlen_q). Out-of-range keys (j >= seqlen_k) are always masked. A sliding
// window (Variant::window) bounds both sides the same way: i + d - window_left <= j <=
// i + d + window_right, d = seqlen_k - seqlen_q (FmhaParams; causal sets window_right to 0).
// `Lengths` is anything with seqlen_q and seqlen_k: the launch's FmhaParams (dense batches) or one
// sequence's SequenceSpan (common/sequence.cuh).
#pragma once

#include "common/params.cuh"
#include "common/user_functions.cuh"

namespace flashjit {

// One past the last key that query row `row` may see (may be <= 0: the row sees nothing).
template <bool Causal, typename Lengths>
__device__ __forceinline__ int key_limit(const Lengths& len, int row) {
  if (!Causal) return len.seqlen_k;
  int limit = row + 1 + len.seqlen_k - len.seqlen_q;
  return limit < len.seqlen_k ? limit : len.seqlen_k;
}

// The last query row of the tile [row0, row0 + TileM) that the sequence has.
template <int TileM, typename Lengths>
__device__ __forceinline__ int last_row_of(const Lengths& len, int row0) {
  int last = row0 + TileM - 1;
  if (last > len.seqlen_q - 1) last = len.seqlen_q - 1;
  return last;
}

// First key that query row `row` may see: 0 without a window.
template <bool Window, typename Lengths>
__device__ __forceinline__ int key_first(const Lengths& len, const FmhaParams& p, int row) {
  if (!Window) return 0;
  const long long first =
      static_cast<long long>(row) + len.seqlen_k - len.seqlen_q - p.window_left;
  return first > 0 ? static_cast<int>(first) : 0;
}

// One past the last key that row `row` may see, the window's right side included (may be <= its
// key_first: the row sees nothing).
template <bool Causal, bool Window, typename Lengths>
__device__ __forceinline__ int key_end(const Lengths& len, const FmhaParams& p, int row) {
  const int limit = key_limit<Causal>(len, row);
  if (!Window) return limit;
  const long long right =
      static_cast<long long>(row) + 1 + len.seqlen_k - len.seqlen_q + p.window_right;
  return right < limit ? static_cast<int>(right) : limit;
}

// StreamingLLM's first keys (FmhaParams::sink_tokens, window variants): the key tiles [0,
// sink_end) left of a band that starts at tile `first` hold them. Keys left of the band are below
// every row's key_end, so these tiles need only the sink bound; tiles from `first` on are the
// band's, whose mask keeps the sink keys too.
template <bool Window, int TileN>
__device__ __forceinline__ int sink_tile_end(const FmhaParams& p, int first) {
  if (!Window) return 0;
  const int tiles = (p.sink_tokens + TileN - 1) / TileN;
  return tiles < first ? tiles : first;
}

// Key tiles [0, sink_end) then [first, end) of a query tile [row0, row0 + TileM): every key some
// row of it may see. Tiles wholly outside the band (left of its first row's window, right of its
// last row's) are never visited, so time scales with the window. count() <= 0: nothing to visit.
struct TileRange {
  int sink_end, first, end;

  __device__ __forceinline__ int count() const { return sink_end + end - first; }
  __device__ __forceinline__ int tile(int v) const {  // the v-th of them
    return v < sink_end ? v : first + (v - sink_end);
  }
};
template <bool Causal, bool Window, int TileM, int TileN, typename Lengths>
__device__ __forceinline__ TileRange kv_tile_range(const Lengths& len, const FmhaParams& p,
                                                   int row0) {
  const int last_row = last_row_of<TileM>(len, row0);
  const int keys = key_end<Causal, Window>(len, p, last_row);
  const int end = keys <= 0 ? 0 : (keys + TileN - 1) / TileN;
  const int first = key_first<Window>(len, p, row0) / TileN;
  return {end > first ? sink_tile_end<Window, TileN>(p, first) : 0, first, end};
}

// The order in which a query tile [row0, row0 + TileM) visits its key tiles (kv_tile_range): the
// tiles no row needs masked, [u0, u1), first, then the masked ones, [0, sink_end) (sink tokens),
// [first, u0) (the band's left side cuts them) and [u1, end) (the diagonal, the band's right side
// or seqlen_k). The online softmax does not depend on the order, and one masked loop serves every
// masked tile. Without a window sink_end = u0 = first = 0: the natural order whatever u1 is.
// Key tile t holds keys [t · TileN + shift, + TileN): with a window, shift may put the tiles'
// grid on the band's first key (tile_order's Shifted), so no tile reaches past the band's left end.
template <bool Window>
struct TileOrder {
  int sink_end, first, u0, u1, end;
  int shift;

  __device__ __forceinline__ int count() const { return sink_end + end - first; }
  __device__ __forceinline__ int unmasked() const { return u1 - u0; }
  __device__ __forceinline__ int tile(int i) const {  // the i-th key tile visited
    if (!Window) return i;
    if (i < u1 - u0) return u0 + i;
    int k = i - (u1 - u0);
    if (k < sink_end) return k;
    k -= sink_end;
    return k < u0 - first ? first + k : u1 + (k - (u0 - first));
  }
};
// Shifted (window variants whose key tiles may start anywhere: dense or varlen caches, no block
// mask) puts the grid on the band's first key unless sink tokens keep their tile at key 0: a
// band of W keys then spans ceil(W / TileN) tiles rather than up to one more (d128's 176-key
// tiles visited 7.0 % more keys than a 4096-key window keeps, 3.4 % so; docs/perf-log.md, s46).
template <bool Causal, bool Window, int TileM, int TileN, bool Shifted = false, typename Lengths>
__device__ __forceinline__ TileOrder<Window> tile_order(const Lengths& len, const FmhaParams& p,
                                                int row0) {
  static_assert(Window || !Shifted, "only a window's band moves the grid");
  const TileRange range = kv_tile_range<Causal, Window, TileM, TileN>(len, p, row0);
  const int last_row = last_row_of<TileM>(len, row0);
  const int band0 = key_first<Window>(len, p, row0);
  const int shift = Shifted && p.sink_tokens == 0 ? band0 % TileN : 0;
  // range.first is band0's tile either way; the end moves with the grid.
  const int last_key_end = key_end<Causal, Window>(len, p, last_row);
  const int end =
      Shifted && last_key_end > band0 ? (last_key_end - shift + TileN - 1) / TileN : range.end;
  int u0 = Window ? (key_first<Window>(len, p, last_row) - shift + TileN - 1) / TileN
                  : range.first;
  u0 = u0 < range.first ? range.first : (u0 > end ? end : u0);
  const int right = key_end<Causal, Window>(len, p, row0) - shift;
  int u1 = (right > 0 ? right : 0) / TileN;
  u1 = u1 < u0 ? u0 : (u1 > end ? end : u1);
  return {range.sink_end, range.first, u0, u1, end, shift};
}

// The key tiles a query tile visits, in order: its Order (TileOrder in wgmma, kv_tile_range's
// TileRange in mma), or in a kernel's block-mask entry (Listed: the kernels' BlockMask template
// argument; FmhaParams::block_tiles is then always set) the mask's list, the tiles no mask touches
// first (the block mask kernel writes those at the front of a row of block_tiles, the partly
// masked at its back, from the last slot down). With a mask_mod every visit is masked but those a
// block mask lists as untouched.
template <typename Order, bool Listed>
struct ListedVisits {
  Order order;
  const int* listed;  // the block mask's tiles
  int listed_unmasked, listed_count;

  __device__ __forceinline__ int count() const { return Listed ? listed_count : order.count(); }
  __device__ __forceinline__ int unmasked() const {  // TileOrder's visits needing no mask
    if constexpr (Listed) return listed_unmasked;
    return user::kMaskMod ? 0 : order.unmasked();
  }
  __device__ __forceinline__ bool untouched(int i) const {  // listed as needing no mask
    return Listed && i < listed_unmasked;
  }
  __device__ __forceinline__ int tile(int i) const {
    if constexpr (!Listed) return order.tile(i);
    // Untouched tiles from the front of the list, partly masked ones from its back.
    return __ldg(listed + (i < listed_unmasked ? i : last_slot - (i - listed_unmasked)));
  }
  // The first key of the i-th visit's tile (TileOrder::shift).
  template <int TileN>
  __device__ __forceinline__ int key0(int i) const {
    if constexpr (Listed) return tile(i) * TileN;
    return tile(i) * TileN + order.shift;
  }
  int last_slot;  // block_key_tiles - 1
};
template <bool Window, bool Listed>
using TileVisits = ListedVisits<TileOrder<Window>, Listed>;

// Lists the block mask's tiles for query tile m_block of (batch, head) in `v`.
template <typename Order, bool Listed>
__device__ __forceinline__ void list_block_mask(ListedVisits<Order, Listed>& v,
                                                const FmhaParams& p, int batch, int head,
                                                int m_block) {
  if constexpr (Listed) {
    const long long entry = batch * p.block_stride_b + head * p.block_stride_h + m_block;
    v.listed = p.block_tiles + entry * p.block_key_tiles;
    v.listed_unmasked = __ldg(p.block_counts + kBlockCounts * entry);
    v.listed_count = v.listed_unmasked + __ldg(p.block_counts + kBlockCounts * entry + 1);
    v.last_slot = p.block_key_tiles - 1;
  }
}
template <bool Causal, bool Window, bool Listed, int TileM, int TileN, bool Shifted = false,
          typename Lengths>
__device__ __forceinline__ TileVisits<Window, Listed> tile_visits(const Lengths& len,
                                                                  const FmhaParams& p, int batch,
                                                                  int head, int m_block) {
  TileVisits<Window, Listed> v{
      tile_order<Causal, Window, TileM, TileN, Shifted && !Listed>(len, p, m_block * TileM),
      nullptr, 0, 0, 0};
  list_block_mask(v, p, batch, head, m_block);
  return v;
}

// Key tiles [0, n_tiles) hold every key some row of [row0, row0 + TileM) may see; tiles above the
// diagonal are never visited.
template <bool Causal, int TileM, int TileN, typename Lengths>
__device__ __forceinline__ int kv_tile_count(const Lengths& len, int row0) {
  const int last_row = last_row_of<TileM>(len, row0);
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

// tile_needs_mask with a window: also where the band's left side cuts into the tile (key0 below
// the first key of the tile's last row) or its right side does (past the first row's end).
template <bool Causal, bool Window, int TileM, int TileN, typename Lengths>
__device__ __forceinline__ bool tile_needs_band_mask(const Lengths& len, const FmhaParams& p,
                                                     int row0, int key0) {
  if (!Window) return tile_needs_mask<Causal, TileM, TileN>(len, row0, key0);
  if (key0 + TileN > len.seqlen_k) return true;
  const int last_row = last_row_of<TileM>(len, row0);
  return key0 < key_first<true>(len, p, last_row) ||
         key0 + TileN > key_end<Causal, true>(len, p, row0);
}

}  // namespace flashjit

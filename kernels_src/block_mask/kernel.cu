// build_block_mask: the block mask of a user mask_mod (Engine::create_block_mask) for the tiles of
// one attention variant. One CTA per entry of the map (query tile, head, batch: blockIdx x, y, z)
// evaluates every score of each key tile the causal / window masks let the query tile visit, and
// lists the tiles where some score is visible: those where all are at the front of the entry's
// row of block_tiles (ascending), those where only some are at its back (ascending from the last
// slot down, TileVisits reads them so), with their numbers in block_counts. Rows past the
// sequence's seqlen_q count for nothing; keys past its seqlen_k are hidden.
#include "block_mask/shape.cuh"
#include "block_mask/tile_visibility.cuh"
#include "common/grid_dependency.cuh"
#include "common/masking.cuh"
#include "common/params.cuh"
#include "common/sequence.cuh"
#include "common/types.cuh"
#include "common/user_functions.cuh"

namespace flashjit {

// T: the registry's element type argument, which a mask does not use.
template <typename T, int TileM, int TileN, bool Causal, bool Window, bool Varlen>
__global__ void __launch_bounds__(BlockMaskShape::kThreads)
    build_block_mask_kernel(const FmhaParams p) {
  begin_after_previous_grid();
  const int m_block = blockIdx.x, head = blockIdx.y, batch = blockIdx.z;
  const long long entry = batch * p.block_stride_b + head * p.block_stride_h + m_block;
  // The map is this kernel's output; forward reads it through the same (const) fields.
  int* counts = const_cast<int*>(p.block_counts) + kBlockCounts * entry;
  int* tiles = const_cast<int*>(p.block_tiles) + entry * p.block_key_tiles;
  const SequenceLengths seq = sequence_span<Varlen>(p, batch).lengths();
  const int row0 = m_block * TileM;
  int full = 0, partial = 0, visitable = 0;  // thread 0's
  if (row0 < seq.seqlen_q) {
    const TileRange range = kv_tile_range<Causal, Window, TileM, TileN>(seq, p, row0);
    visitable = max(range.count(), 0);
    const int rows = min(TileM, seq.seqlen_q - row0);
    for (int v = 0; v < range.count(); ++v) {
      const int j = range.tile(v);
      const TileVisibility tile =
          tile_visibility<Causal, Window, TileN>(seq, p, batch, head, row0, rows, j * TileN);
      if (threadIdx.x == 0 && tile.seen) {
        if (tile.hidden)
          tiles[p.block_key_tiles - 1 - partial++] = j;
        else
          tiles[full++] = j;
      }
    }
  }
  if (threadIdx.x == 0) {
    counts[0] = full;
    counts[1] = partial;
    counts[2] = visitable;
  }
}

}  // namespace flashjit

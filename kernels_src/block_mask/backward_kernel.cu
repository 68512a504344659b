// build_backward_block_mask: the key-major block mask of a user mask_mod for one backward dK/dV
// variant (Engine::create_backward_block_mask). One CTA per entry of the map (key tile, KV head,
// batch: blockIdx x, y, z) walks the steps the dK/dV kernel takes for the key tile without a map
// (each query head of the group, then each query tile that causal / window let see the tile:
// QueryTilesSeeing) and evaluates every score of each; the steps with some visible score are
// listed in that order (common/bwd_block_mask.cuh), kPartialStep marking those where some score
// is hidden. A map shared by every head (block_stride_h 0) is evaluated at head 0. Rows past the
// sequence's seqlen_q count for nothing; keys past its seqlen_k are hidden.
#include "block_mask/shape.cuh"
#include "block_mask/tile_visibility.cuh"
#include "common/bwd_block_mask.cuh"
#include "common/bwd_scores.cuh"
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
    build_backward_block_mask_kernel(const FmhaParams p) {
  begin_after_previous_grid();
  const int key_tile = blockIdx.x, kv_head = blockIdx.y, batch = blockIdx.z;
  const long long entry = batch * p.block_stride_b + kv_head * p.block_stride_h + key_tile;
  // The map is this kernel's output; the dK/dV kernels read it through the same (const) fields.
  int* counts = const_cast<int*>(p.block_counts) + kBlockCounts * entry;
  int* steps = const_cast<int*>(p.block_tiles) + entry * p.block_key_tiles;
  const SequenceLengths seq = sequence_span<Varlen>(p, batch).lengths();
  const int key0 = key_tile * TileN;
  int full = 0, partial = 0, visitable = 0;  // thread 0's
  if (key0 < seq.seqlen_k && seq.seqlen_q > 0) {
    const QueryTilesSeeing<Causal, Window, TileM> seeing(p, seq, key0, key0 + TileN - 1);
    for (int g = 0; g < p.heads_per_kv; ++g) {
      const int head = p.block_stride_h == 0 ? 0 : kv_head * p.heads_per_kv + g;
      visitable += max(seeing.count, 0);
      for (int m = seeing.first; m < seeing.first + seeing.count; ++m) {
        const int row0 = m * TileM, rows = min(TileM, seq.seqlen_q - row0);
        const TileVisibility tile =
            tile_visibility<Causal, Window, TileN>(seq, p, batch, head, row0, rows, key0);
        if (threadIdx.x == 0 && tile.seen) {
          steps[full + partial] = (g << kStepTileBits) | m | (tile.hidden ? kPartialStep : 0);
          ++(tile.hidden ? partial : full);
        }
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

// build_backward_block_mask: the key-major block mask of a user mask_mod for one backward dK/dV
// variant (Engine::create_backward_block_mask). One CTA per entry of the map (key tile, KV head,
// batch: blockIdx x, y, z) walks the steps the dK/dV kernel takes for the key tile without a map
// (each query head of the group, then each query tile that causal / window let see the tile:
// QueryTilesSeeing) and evaluates every score of each; the steps with some visible score are
// listed in that order (common/bwd_block_mask.cuh), kPartialStep marking those where some score
// is hidden. A map shared by every head (block_stride_h 0) is evaluated at head 0. Rows past the
// sequence's seqlen_q count for nothing; keys past its seqlen_k are hidden.
#include "block_mask/shape.cuh"
#include "common/bwd_block_mask.cuh"
#include "common/bwd_scores.cuh"
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
    const int keys = min(TileN, seq.seqlen_k - key0);
    for (int g = 0; g < p.heads_per_kv; ++g) {
      const int head = p.block_stride_h == 0 ? 0 : kv_head * p.heads_per_kv + g;
      visitable += max(seeing.count, 0);
      for (int m = seeing.first; m < seeing.first + seeing.count; ++m) {
        const int row0 = m * TileM, rows = min(TileM, seq.seqlen_q - row0);
        bool seen = false, hidden = keys < TileN;  // keys past seqlen_k are hidden
        for (int at = threadIdx.x; at < rows * keys; at += BlockMaskShape::kThreads) {
          const int row = row0 + at / keys, key = key0 + at % keys;
          bool visible = key < key_end<Causal, Window>(seq, p, row) &&
                         (!Window || key >= key_first<Window>(seq, p, row) || key < p.sink_tokens);
          if (visible) visible = user::mask_mod(batch, head, row, key, p.user_args);
          seen |= visible;
          hidden |= !visible;
        }
        seen = __syncthreads_or(seen);
        hidden = __syncthreads_or(hidden);
        if (threadIdx.x == 0 && seen) {
          steps[full + partial] = (g << kStepTileBits) | m | (hidden ? kPartialStep : 0);
          ++(hidden ? partial : full);
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

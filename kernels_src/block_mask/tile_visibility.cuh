// tile_visibility: what a user mask_mod (with the causal / window masks) leaves of one tile of
// scores, decided by a whole CTA of the block-mask builders (block_mask/kernel.cu for the
// forward's map, block_mask/backward_kernel.cu for the backward's).
#pragma once

#include "block_mask/shape.cuh"
#include "common/masking.cuh"
#include "common/params.cuh"
#include "common/user_functions.cuh"

namespace flashjit {

struct TileVisibility {
  bool seen;    // some score of the tile is visible
  bool hidden;  // some score of the tile is hidden
};

// Rows [row0, row0 + rows) against keys [key0, key0 + TileN), every thread of the CTA taking a
// share and agreeing on the answer (__syncthreads_or: all threads must call). Keys past the
// sequence's seqlen_k are hidden (key_end stops there), and the mask_mod never sees them.
template <bool Causal, bool Window, int TileN, typename Lengths>
__device__ __forceinline__ TileVisibility tile_visibility(const Lengths& seq, const FmhaParams& p,
                                                          int batch, int head, int row0, int rows,
                                                          int key0) {
  bool seen = false, hidden = false;
  for (int at = threadIdx.x; at < rows * TileN; at += BlockMaskShape::kThreads) {
    const int row = row0 + at / TileN, key = key0 + at % TileN;
    bool visible = key < key_end<Causal, Window>(seq, p, row) &&
                   (!Window || key >= key_first<Window>(seq, p, row) || key < p.sink_tokens);
    if (visible) visible = user::mask_mod(batch, head, row, key, p.user_args);
    seen |= visible;
    hidden |= !visible;
  }
  return {__syncthreads_or(seen) != 0, __syncthreads_or(hidden) != 0};
}

}  // namespace flashjit

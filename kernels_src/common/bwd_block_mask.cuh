// How the backward kernels read a backward block mask (Engine::create_backward_block_mask), in
// their block-mask entries (Listed = the kernels' BlockMask template argument: compiled for
// variants with a mask_mod, launched when FmhaParams::block_tiles is set). The other entries get
// the empty specializations, whose `*_or` members return their fallback: the same code as
// without block masks (checked by hashing their machine code).
//  - dK/dV kernels (key-major map, FmhaParams::block_* at their launch): entry r = batch ·
//    block_stride_b + kv_head · block_stride_h + key tile lists the steps the key tile takes, in
//    the order the kernel walks them without a map (query head, then query tile ascending), as
//    head_in_group << 16 | query_tile, with kPartialStep set where the mask hides some score:
//    skipped steps add exact zeros, so dK and dV keep their bits. block_counts[kBlockCounts r]:
//    untouched steps, + 1: partial ones, + 2: what causal / window leave.
//  - dQ kernels (the forward's map at their tiles, block_mask/kernel.cu): the key tiles of entry
//    batch · block_stride_b + head · block_stride_h + query tile, untouched ones first (from the
//    list's front), then partial ones (from its back), as the forward reads them (TileVisits).
#pragma once

#include "common/params.cuh"

namespace flashjit {

constexpr int kPartialStep = static_cast<int>(0x80000000u);  // some score of the step is masked
constexpr int kStepTileBits = 16;                             // query tile in the low 16 bits

// dK/dV kernels: the steps of key tile `key_tile` of a KV head (find(): block-mask entries only,
// in `if constexpr`; the others hold no state). The kernels call these under `if constexpr`
// although the empty `*_or` return their fallback: unguarded calls changed the other entries'
// machine code (18 of 56 plain backward variants, session 19).
template <bool Listed>
struct ListedSteps {
  __device__ __forceinline__ void find(const FmhaParams&, int, int, int) {}
  __device__ __forceinline__ int count_or(int unlisted) const { return unlisted; }
  __device__ __forceinline__ int head_offset_or(int, int unlisted) const { return unlisted; }
  __device__ __forceinline__ int tile_or(int, int unlisted) const { return unlisted; }
  __device__ __forceinline__ bool masked_or(int, bool unlisted) const { return unlisted; }
};
template <>
struct ListedSteps<true> {
  const int* steps = nullptr;
  int count = 0;
  __device__ __forceinline__ void find(const FmhaParams& p, int batch, int kv_head, int key_tile) {
    const long long entry = batch * p.block_stride_b + kv_head * p.block_stride_h + key_tile;
    steps = p.block_tiles + entry * p.block_key_tiles;
    count = __ldg(p.block_counts + kBlockCounts * entry) +
            __ldg(p.block_counts + kBlockCounts * entry + 1);
  }
  __device__ __forceinline__ int count_or(int) const { return count; }
  __device__ __forceinline__ int head_offset_or(int t, int) const {
    return (__ldg(steps + t) & ~kPartialStep) >> kStepTileBits;
  }
  __device__ __forceinline__ int tile_or(int t, int) const {
    return __ldg(steps + t) & ((1 << kStepTileBits) - 1);
  }
  __device__ __forceinline__ bool masked_or(int t, bool) const { return __ldg(steps + t) < 0; }
};

// dQ kernels: the key tiles of query tile `m_tile` of a query head (the same way).
template <bool Listed>
struct ListedKeyTiles {
  __device__ __forceinline__ void find(const FmhaParams&, int, int, int) {}
  __device__ __forceinline__ int count_or(int unlisted) const { return unlisted; }
  __device__ __forceinline__ int tile_or(int, int unlisted) const { return unlisted; }
  __device__ __forceinline__ bool masked_or(int, bool unlisted) const { return unlisted; }
};
template <>
struct ListedKeyTiles<true> {
  const int* tiles = nullptr;
  int unmasked = 0, count = 0, last_slot = 0;
  __device__ __forceinline__ void find(const FmhaParams& p, int batch, int head, int m_tile) {
    const long long entry = batch * p.block_stride_b + head * p.block_stride_h + m_tile;
    tiles = p.block_tiles + entry * p.block_key_tiles;
    unmasked = __ldg(p.block_counts + kBlockCounts * entry);
    count = unmasked + __ldg(p.block_counts + kBlockCounts * entry + 1);
    last_slot = p.block_key_tiles - 1;
  }
  __device__ __forceinline__ int count_or(int) const { return count; }
  __device__ __forceinline__ int tile_or(int j, int) const {
    return __ldg(tiles + (j < unmasked ? j : last_slot - (j - unmasked)));
  }
  __device__ __forceinline__ bool masked_or(int j, bool) const { return j >= unmasked; }
};

}  // namespace flashjit

// ALiBi in the wgmma kernel (wgmma/kernel.cu): the bias on the scores a thread holds, and under
// causal masking its column part from the tensor cores (AlibiSlices).
#pragma once

#include "common/types.cuh"
#include "common/user_functions.cuh"
#include "common/warpgroup_size.cuh"
#include "wgmma/shape.cuh"

namespace flashjit {

// ALiBi on the two rows a thread holds; `distance` is row 0's diagonal minus the thread's first
// key (row 1's is 8 more). Causal (every visible key at or left of the diagonal): -slope·(d - c)
// = slope·c - slope·d, so each score takes one FMA with its column's immediate and the rows'
// -slope·d goes to row_bias (RowSoftmax::update); keys right of the diagonal are masked anyway.
// (Where AlibiSlices fit, Q·Kᵀ adds slope·c instead.) Otherwise the distance's sign varies within
// the tile: -slope·|d - c| per score.
template <bool Causal, int TileN>
__device__ __forceinline__ void alibi_scores(float (&s)[TileN / 2], float slope, int distance,
                                             float (&row_bias)[2]) {
#pragma unroll
  for (int i = 0; i < 2; ++i) {
    const float d = static_cast<float>(distance + 8 * i);
    row_bias[i] = Causal ? -slope * d : 0.f;
#pragma unroll
    for (int e = 2 * i; e < TileN / 2; e += 4)
#pragma unroll
      for (int k = 0; k < 2; ++k) {
        const float column = static_cast<float>(8 * ((e + k) / 4) + (e + k) % 2);
        s[e + k] = Causal ? fmaf(slope, column, s[e + k])
                          : fmaf(-slope, fabsf(d - column), s[e + k]);
      }
  }
}

// WgmmaGeometry::causal_alibi of this kernel's variant.
template <bool Alibi, bool Causal, bool Softcap>
inline constexpr bool kCausalAlibi = WgmmaGeometry::takes_causal_alibi(
    Alibi, Causal, Softcap, user::kScoreMod || user::kMaskMod);

// Causal ALiBi's column part from the tensor cores: -slope · (diagonal - key) = slope · c -
// slope · (diagonal - tile start) for the key c columns into the tile. Q·Kᵀ gains a k16 slice:
// each of Q's rows holds the head's slope (raw score units) as three 16-bit parts, each key row
// of the tile its column c (exact up to 256), so the product adds slope · c to the score (to
// ~2^-24 of it); the rest is the rows' bias (RowSoftmax::update's row_bias). Every part and c
// stand in both 16-byte halves of the 32-byte rows, at half the slope: the sum is the same in
// either order of the halves, which is all the 32-byte swizzle changes. The key rows never
// change (written at the kernel's start); each consumer writes its 64 Q rows per query tile.
struct AlibiSlices {
  template <typename T>
  static __device__ __forceinline__ uint4 row(float a, float b, float c) {
    return make_uint4(pack2<T>(a, b), pack2<T>(c, 0.f), 0u, 0u);
  }
  // Half-rows i of the key slice (row i / 2), by the CTA's threads.
  template <typename T, int TileN, int Threads>
  static __device__ __forceinline__ void write_keys(unsigned char* keys) {
    for (int i = threadIdx.x; i < 2 * TileN; i += Threads) {
      const float c = static_cast<float>(i / 2);
      *reinterpret_cast<uint4*>(keys + 16 * i) = row<T>(c, c, c);
    }
  }
  // This warpgroup's 64 Q rows, from the head's raw slope: thread t writes half-row t % 2 of row
  // t / 2.
  template <typename T>
  static __device__ __forceinline__ void write_rows(unsigned char* rows, float slope) {
    const float high = to_float(from_float<T>(slope));
    const float middle = to_float(from_float<T>(slope - high));
    const float low = slope - high - middle;
    *reinterpret_cast<uint4*>(rows + 16 * (threadIdx.x % kWarpgroupThreads)) =
        row<T>(0.5f * high, 0.5f * middle, 0.5f * low);
  }
};

}  // namespace flashjit

// fmha_simt: the first correct attention forward. Scalar fp32 math, no tensor cores; the
// reference every faster family is checked against on the GPU. FlashAttention's online softmax
// with exp2 and the scale folded in; causal tiles above the diagonal skipped.
//
// Layout of the work: one CTA per (TileM query rows, head, batch); 4 threads per query row.
// Each thread scores TileN/4 keys of its row and accumulates HeadDim/4 output columns.
#include "common/epilogue.cuh"
#include "common/fast_math.cuh"
#include "common/grid_dependency.cuh"
#include "common/masking.cuh"
#include "common/params.cuh"
#include "common/quad_reduce.cuh"
#include "common/softcap.cuh"
#include "common/tile_io.cuh"
#include "common/types.cuh"
#include "simt/shape.cuh"

namespace flashjit {

constexpr int kSimtThreadsPerRow = SimtShape::kThreadsPerRow;

template <typename T>
__device__ __forceinline__ void unpack8(const uint4& packed, float (&out)[8]) {
  unpack2<T>(packed.x, out[0], out[1]);
  unpack2<T>(packed.y, out[2], out[3]);
  unpack2<T>(packed.z, out[4], out[5]);
  unpack2<T>(packed.w, out[6], out[7]);
}

template <typename T, int HeadDim, int TileM, int TileN, int Stages, bool Causal, bool Softcap,
          bool Window, bool Sink, bool Alibi>
__global__ void __launch_bounds__(SimtShape{HeadDim, TileM, TileN}.threads())
    fmha_simt_kernel(const FmhaParams p) {
  begin_after_previous_grid();
  static_assert(!Window, "simt builds no sliding-window variants (its family lacks the feature)");
  static_assert(!Sink, "simt builds no sink variants (its family lacks the feature)");
  static_assert(!Alibi, "simt builds no ALiBi variants (its family lacks the feature)");
  constexpr SimtShape kShape{HeadDim, TileM, TileN};
  constexpr int kThreads = kShape.threads();
  constexpr int kRowPitch = kShape.row_pitch();
  constexpr int kProbPitch = kShape.prob_pitch();
  constexpr int kKeysPerThread = TileN / kSimtThreadsPerRow;
  constexpr int kDimsPerThread = HeadDim / kSimtThreadsPerRow;
  static_assert(HeadDim % 32 == 0, "each thread owns whole 16-byte output vectors");
  static_assert(TileN % kSimtThreadsPerRow == 0, "keys split evenly over a row's threads");

  extern __shared__ __align__(16) unsigned char smem[];
  T* q_tile = reinterpret_cast<T*>(smem);
  T* kv_tile = q_tile + kShape.q_elements();  // K, then V of the same key tile
  float* probs = reinterpret_cast<float*>(kv_tile + kShape.kv_elements());

  const int m_tile = Causal ? gridDim.x - 1 - blockIdx.x : blockIdx.x;  // longest rows first
  const int head = blockIdx.y;
  const int batch = blockIdx.z;
  const int kv_head = head / p.heads_per_kv;
  const int row0 = m_tile * TileM;
  const int local_row = threadIdx.x / kSimtThreadsPerRow;
  const int lane_in_row = threadIdx.x % kSimtThreadsPerRow;
  const int row = row0 + local_row;

  const T* q = static_cast<const T*>(p.q) + batch * p.q_stride_b + head * p.q_stride_h;
  const T* k = static_cast<const T*>(p.k) + batch * p.k_stride_b + kv_head * p.k_stride_h;
  const T* v = static_cast<const T*>(p.v) + batch * p.v_stride_b + kv_head * p.v_stride_h;

  load_rows_zero_fill<T, HeadDim, TileM, kThreads>(q_tile, kRowPitch, q, p.q_stride_s, row0,
                                                   p.seqlen_q);

  float row_max = neg_inf();
  float row_sum = 0.f;
  float acc[kDimsPerThread];
#pragma unroll
  for (int i = 0; i < kDimsPerThread; ++i) acc[i] = 0.f;

  const int n_tiles = kv_tile_count<Causal, TileM, TileN>(p, row0);
  const int keys_visible = key_limit<Causal>(p, row);
  for (int tile = 0; tile < n_tiles; ++tile) {
    const int key0 = tile * TileN;
    __syncthreads();  // the previous tile's P·V is done with kv_tile
    load_rows_zero_fill<T, HeadDim, TileN, kThreads>(kv_tile, kRowPitch, k, p.k_stride_s, key0,
                                                     p.seqlen_k);
    __syncthreads();

    float score[kKeysPerThread];
#pragma unroll
    for (int j = 0; j < kKeysPerThread; ++j) score[j] = 0.f;
#pragma unroll 2
    for (int d = 0; d < HeadDim; d += 8) {
      float qv[8];
      unpack8<T>(*reinterpret_cast<const uint4*>(q_tile + local_row * kRowPitch + d), qv);
#pragma unroll
      for (int j = 0; j < kKeysPerThread; ++j) {
        float kv[8];
        const int key = lane_in_row + j * kSimtThreadsPerRow;
        unpack8<T>(*reinterpret_cast<const uint4*>(kv_tile + key * kRowPitch + d), kv);
#pragma unroll
        for (int e = 0; e < 8; ++e) score[j] = fmaf(qv[e], kv[e], score[j]);
      }
    }
    soft_cap<Softcap>(score, p);
    if (tile_needs_mask<Causal, TileM, TileN>(p, row0, key0)) {
#pragma unroll
      for (int j = 0; j < kKeysPerThread; ++j)
        if (key0 + lane_in_row + j * kSimtThreadsPerRow >= keys_visible) score[j] = neg_inf();
    }

    float tile_max = neg_inf();
#pragma unroll
    for (int j = 0; j < kKeysPerThread; ++j) tile_max = fmaxf(tile_max, score[j]);
    const float new_max = fmaxf(row_max, quad_max(tile_max));
    const float offset = scaled_max(new_max, p.scale_log2);
    const float correction = exp2_ftz(row_max * p.scale_log2 - offset);  // 0 when row_max=-inf
    float tile_sum = 0.f;
#pragma unroll
    for (int j = 0; j < kKeysPerThread; ++j) {
      const float prob = exp2_ftz(fmaf(score[j], p.scale_log2, -offset));
      tile_sum += prob;
      probs[local_row * kProbPitch + lane_in_row + j * kSimtThreadsPerRow] = prob;
    }
    row_sum = row_sum * correction + quad_sum(tile_sum);
    row_max = new_max;
#pragma unroll
    for (int i = 0; i < kDimsPerThread; ++i) acc[i] *= correction;

    __syncthreads();  // scores are done with K; probs are complete
    load_rows_zero_fill<T, HeadDim, TileN, kThreads>(kv_tile, kRowPitch, v, p.v_stride_s, key0,
                                                     p.seqlen_k);
    __syncthreads();

    const int dim0 = lane_in_row * kDimsPerThread;
#pragma unroll 4
    for (int key = 0; key < TileN; ++key) {
      const float prob = probs[local_row * kProbPitch + key];
#pragma unroll
      for (int d = 0; d < kDimsPerThread; d += 8) {
        float vv[8];
        unpack8<T>(*reinterpret_cast<const uint4*>(kv_tile + key * kRowPitch + dim0 + d), vv);
#pragma unroll
        for (int e = 0; e < 8; ++e) acc[d + e] = fmaf(prob, vv[e], acc[d + e]);
      }
    }
  }

  if (row >= p.seqlen_q) return;
  const float scale = output_scale(row_sum);
  T* o = static_cast<T*>(p.o) + batch * p.o_stride_b + head * p.o_stride_h + row * p.o_stride_s +
         lane_in_row * kDimsPerThread;
#pragma unroll
  for (int d = 0; d < kDimsPerThread; d += 8) {
    uint4 packed;
    packed.x = pack2<T>(acc[d + 0] * scale, acc[d + 1] * scale);
    packed.y = pack2<T>(acc[d + 2] * scale, acc[d + 3] * scale);
    packed.z = pack2<T>(acc[d + 4] * scale, acc[d + 5] * scale);
    packed.w = pack2<T>(acc[d + 6] * scale, acc[d + 7] * scale);
    *reinterpret_cast<uint4*>(o + d) = packed;
  }
  if (p.lse != nullptr && lane_in_row == 0)
    store_row_lse(p, batch, head, row, finish_row<false>(p, head, row_max, row_sum).lse());
}

}  // namespace flashjit

// merge_states: combines partial attention results over disjoint key sets through their LSE, one
// warp per (batch, token, head) row: split-KV partials (fp32) and merge_attention_states (16-bit).
// out = sum_i e^(lse_i - m) o_i / sum_i e^(lse_i - m), lse = m + log(sum_i e^(lse_i - m)), where
// m = max_i lse_i; rows whose states are all empty (lse -inf) come out 0 with LSE -inf.
#include "common/fast_math.cuh"
#include "common/params.cuh"
#include "common/types.cuh"
#include "merge/shape.cuh"

namespace flashjit {

// N consecutive elements as floats, through the widest loads their alignment allows (rows are
// 16-byte aligned and every lane's chunk starts at a multiple of N elements).
template <int N>
__device__ __forceinline__ void load_chunk(const float* from, float (&to)[N]) {
  if constexpr (N % 4 == 0) {
#pragma unroll
    for (int i = 0; i < N; i += 4) {
      const float4 v = *reinterpret_cast<const float4*>(from + i);
      to[i] = v.x, to[i + 1] = v.y, to[i + 2] = v.z, to[i + 3] = v.w;
    }
  } else {
#pragma unroll
    for (int i = 0; i < N; ++i) to[i] = from[i];
  }
}
template <typename T, int N>
__device__ __forceinline__ void load_chunk(const T* from, float (&to)[N]) {
  if constexpr (N % 2 == 0) {
#pragma unroll
    for (int i = 0; i < N; i += 2)
      unpack2<T>(*reinterpret_cast<const unsigned*>(from + i), to[i], to[i + 1]);
  } else {
#pragma unroll
    for (int i = 0; i < N; ++i) to[i] = to_float(from[i]);
  }
}

template <typename T, int HeadDim, int Warps>
__global__ void __launch_bounds__(Warps * 32) merge_states_kernel(const MergeParams p) {
  static_assert(HeadDim % 32 == 0, "whole columns per lane");
  constexpr int N = HeadDim / 32;  // columns per lane
  constexpr float kLog2e = 1.4426950408889634f;
  const int lane = threadIdx.x % 32;
  const long long row = static_cast<long long>(blockIdx.x) * Warps + threadIdx.x / 32;
  if (row >= static_cast<long long>(p.batch) * p.seqlen * p.heads) return;
  const int head = static_cast<int>(row % p.heads);
  const int token = static_cast<int>(row / p.heads % p.seqlen);
  const int batch = static_cast<int>(row / p.heads / p.seqlen);
  long long out_row = static_cast<long long>(batch) * p.out_stride_b + token * p.out_stride_s;
  long long lse_out_index = (static_cast<long long>(batch) * p.heads + head) * p.seqlen + token;
  if (p.cu_seqlens != nullptr) {  // varlen: skip rows past the sequence, write packed rows
    const int start = __ldg(p.cu_seqlens + batch);
    if (token >= __ldg(p.cu_seqlens + batch + 1) - start) return;
    out_row = (start + token) * p.out_stride_s;
    lse_out_index = static_cast<long long>(head) * p.total + start + token;
  }

  const float* lse = p.lse_in + batch * p.lse_stride_b + token * p.lse_stride_s +
                     head * p.lse_stride_h;
  float best = neg_inf();
  for (int i = 0; i < p.num_states; ++i) best = fmaxf(best, lse[i * p.lse_stride_state]);

  const long long o_offset =
      batch * p.o_stride_b + token * p.o_stride_s + head * p.o_stride_h + lane * N;
  float acc[N] = {};
  float total = 0.f;
  if (best != neg_inf()) {
    for (int i = 0; i < p.num_states; ++i) {
      const float weight = exp2_ftz((lse[i * p.lse_stride_state] - best) * kLog2e);
      float part[N];
      if (p.input_is_fp32)
        load_chunk<N>(static_cast<const float*>(p.o_in) + o_offset + i * p.o_stride_state, part);
      else
        load_chunk<T, N>(static_cast<const T*>(p.o_in) + o_offset + i * p.o_stride_state, part);
#pragma unroll
      for (int e = 0; e < N; ++e) acc[e] += part[e] * weight;
      total += weight;
    }
  }
  const float scale = total > 0.f ? rcp_approx_ftz(total) : 0.f;
  T* out = static_cast<T*>(p.o_out) + out_row + head * p.out_stride_h + lane * N;
  __syncwarp();  // every lane has read its inputs: the output may be one of them
  if constexpr (N % 2 == 0) {
#pragma unroll
    for (int e = 0; e < N; e += 2)
      *reinterpret_cast<unsigned*>(out + e) = pack2<T>(acc[e] * scale, acc[e + 1] * scale);
  } else {
#pragma unroll
    for (int e = 0; e < N; ++e) out[e] = from_float<T>(acc[e] * scale);
  }
  if (p.lse_out != nullptr && lane == 0)
    p.lse_out[lse_out_index] =
        total > 0.f ? best + log2_approx(total) * 0.69314718055994530942f : neg_inf();
}

}  // namespace flashjit

// merge_states: combines partial attention results over disjoint key sets through their LSE, one
// warp per (batch, token, head) row: split-KV partials (fp32) and merge_attention_states (16-bit).
// out = sum_i e^(lse_i - m) o_i / sum_i e^(lse_i - m), lse = m + log(sum_i e^(lse_i - m)), where
// m = max_i lse_i; rows whose states are all empty (lse -inf) come out 0 with LSE -inf.
#include "common/fast_math.cuh"
#include "common/grid_dependency.cuh"
#include "common/params.cuh"
#include "common/types.cuh"
#include "common/warp_reduce.cuh"
#include "merge/shape.cuh"

namespace flashjit {

// N consecutive elements (fp32 partials or 16-bit outputs) as floats, through the widest loads
// their alignment allows (rows are 16-byte aligned and every lane's chunk starts at a multiple of
// N elements).
template <typename In, int N>
__device__ __forceinline__ void load_chunk(const In* from, float (&to)[N]) {
  if constexpr (sizeof(In) == 4 && N % 4 == 0) {
#pragma unroll
    for (int i = 0; i < N; i += 4) {
      const float4 v = *reinterpret_cast<const float4*>(from + i);
      to[i] = v.x, to[i + 1] = v.y, to[i + 2] = v.z, to[i + 3] = v.w;
    }
  } else if constexpr (sizeof(In) == 2 && N % 2 == 0) {
#pragma unroll
    for (int i = 0; i < N; i += 2)
      unpack2<In>(*reinterpret_cast<const unsigned*>(from + i), to[i], to[i + 1]);
  } else {
#pragma unroll
    for (int i = 0; i < N; ++i) to[i] = to_float(from[i]);
  }
}

// acc += sum over states s of weight[s] * o_s; kBatch states' loads are issued before any is
// used, so they are in flight together.
template <typename In, int N>
__device__ __forceinline__ void accumulate_states(const In* o, long long state_stride,
                                                  int num_states, const float* weight,
                                                  float (&acc)[N]) {
  constexpr int kBatch = 8;
  for (int first = 0; first < num_states; first += kBatch) {
    float part[kBatch][N], w[kBatch];
#pragma unroll
    for (int b = 0; b < kBatch; ++b) {
      const bool live = first + b < num_states;
      w[b] = live ? weight[first + b] : 0.f;
      if (live) load_chunk<In, N>(o + (first + b) * state_stride, part[b]);
    }
    // An empty state (weight 0) is not read into the sum: its output may be anything, even NaN.
#pragma unroll
    for (int b = 0; b < kBatch; ++b)
#pragma unroll
      for (int e = 0; e < N; ++e) acc[e] = w[b] > 0.f ? fmaf(part[b][e], w[b], acc[e]) : acc[e];
  }
}

template <typename T, int HeadDim, int Warps>
__global__ void __launch_bounds__(Warps * 32) merge_states_kernel(const MergeParams p) {
  begin_after_previous_grid();
  static_assert(HeadDim % 32 == 0, "whole columns per lane");
  constexpr int N = HeadDim / 32;  // columns per lane
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

  // Lane l reads the LSEs of states l, l + 32, ...: one round of independent loads instead of a
  // chain of num_states dependent ones (the merge of a 16-split row was latency-bound). The
  // weights go to shared memory, where every lane reads them all.
  __shared__ float weights[Warps][MergeShape::kMaxStates];
  float* weight = weights[threadIdx.x / 32];
  const float* lse = p.lse_in + batch * p.lse_stride_b + token * p.lse_stride_s +
                     head * p.lse_stride_h;
  constexpr int kStatesPerLane = MergeShape::kMaxStates / 32;
  float state_lse[kStatesPerLane];
  float best = neg_inf();
#pragma unroll
  for (int k = 0; k < kStatesPerLane; ++k) {
    const int state = k * 32 + lane;
    state_lse[k] = state < p.num_states ? lse[state * p.lse_stride_state] : neg_inf();
    best = fmaxf(best, state_lse[k]);
  }
  best = warp_max(best);

  const long long o_offset =
      batch * p.o_stride_b + token * p.o_stride_s + head * p.o_stride_h + lane * N;
  float acc[N] = {};
  float total = 0.f;
  if (best != neg_inf()) {
#pragma unroll
    for (int k = 0; k < kStatesPerLane; ++k) {
      const float w = exp2_ftz((state_lse[k] - best) * kLog2e);  // 0 for an empty state
      weight[k * 32 + lane] = w;
      total += w;
    }
    total = warp_sum(total);
    __syncwarp();
    if (p.input_is_fp32)
      accumulate_states<float, N>(static_cast<const float*>(p.o_in) + o_offset,
                                  p.o_stride_state, p.num_states, weight, acc);
    else
      accumulate_states<T, N>(static_cast<const T*>(p.o_in) + o_offset, p.o_stride_state,
                              p.num_states, weight, acc);
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

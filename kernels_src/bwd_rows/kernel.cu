// The backward pass's row passes over every (query row, head, batch), for equal-length and varlen
// batches alike (cu_seqlens_q read at run time: these passes are cheap), geometry in shape.cuh:
//  - bwd_prep_kernel, before the dK/dV and dQ kernels: delta = rowsum(dO ∘ O), the LSE in exp2
//    units (+inf where the row saw no key or does not exist, so its probabilities are exactly
//    0), and a zeroed fp32 dQ accumulator row for the atomic mode;
//  - bwd_convert_kernel, after them: dq = softmax_scale · the accumulator, in the element type;
//  - bwd_sink_kernel, after bwd_prep, one CTA per query head (learnable sinks whose gradient is
//    asked for): dsink = -Σ over batch and rows of exp(sink - lse) · delta, in a fixed order.
#include "bwd_rows/shape.cuh"
#include "common/bwd_workspace.cuh"
#include "common/epilogue.cuh"
#include "common/fast_math.cuh"
#include "common/grid_dependency.cuh"
#include "common/params.cuh"
#include "common/sequence.cuh"
#include "common/types.cuh"
#include "common/warp_reduce.cuh"

namespace flashjit {

// The rows of (sequence, head) in the workspace (common/bwd_workspace.cuh): the first, and how
// many the kernels read (its length padded to whole tiles).
struct WorkspaceRows {
  long long first;
  long long padded;

  __device__ __forceinline__ WorkspaceRows(const BackwardParams& p, const SequenceSpan& seq,
                                           int batch, int head)
      : first(p.fwd.cu_seqlens_q != nullptr
                  ? BwdWorkspaceRows::first_row<true>(batch, head, p.fwd.heads_q, p.seqlen_rows,
                                                      seq.q_start)
                  : BwdWorkspaceRows::first_row<false>(batch, head, p.fwd.heads_q, p.seqlen_rows,
                                                       seq.q_start)),
        padded(BwdWorkspaceRows::padded_rows(seq.seqlen_q)) {}
};

// Eight columns of O and dO, their products summed.
template <typename T>
__device__ __forceinline__ float dot8(const uint4& a, const uint4& b) {
  const unsigned av[4] = {a.x, a.y, a.z, a.w}, bv[4] = {b.x, b.y, b.z, b.w};
  float dot = 0.f;
#pragma unroll
  for (int i = 0; i < 4; ++i) {
    float a0, a1, b0, b1;
    unpack2<T>(av[i], a0, a1);
    unpack2<T>(bv[i], b0, b1);
    dot = fmaf(a0, b0, fmaf(a1, b1, dot));
  }
  return dot;
}

template <typename T, int HeadDim>
__global__ void __launch_bounds__(BwdRowsShape::kThreads) bwd_prep_kernel(const BackwardParams p) {
  begin_after_previous_grid();
  constexpr int kLanes = BwdRowsShape::prep_lanes(HeadDim);
  constexpr int kRows = BwdRowsShape::prep_rows(HeadDim);
  static_assert(BwdWorkspaceRows::kRowQuantum % kRows == 0, "whole CTAs of padded rows");
  const int row = blockIdx.x * kRows + threadIdx.x / kLanes;
  const int col = threadIdx.x % kLanes * BwdRowsShape::kVectorElements;
  const int head = blockIdx.y, batch = blockIdx.z;
  const FmhaParams& f = p.fwd;
  const SequenceSpan seq = sequence_span(f, batch);
  const WorkspaceRows rows(p, seq, batch, head);
  // The dK/dV launch that follows takes its tiles from here.
  if ((blockIdx.x | blockIdx.y | blockIdx.z | threadIdx.x) == 0 && p.tile_counter != nullptr)
    *p.tile_counter = 0;
  if (row >= rows.padded) return;  // the whole CTA (static_assert above): the sum below needs all
  const long long r = rows.first + row;
  const bool real_row = row < seq.seqlen_q;
  float dot = 0.f;
  if (real_row && col < HeadDim) {
    const long long q_row = seq.q_start + row;
    const T* o = static_cast<const T*>(f.o) + seq.q_batch * f.o_stride_b + q_row * f.o_stride_s +
                 head * f.o_stride_h;
    const T* d = static_cast<const T*>(p.dout) + seq.q_batch * p.do_stride_b +
                 q_row * p.do_stride_s + head * p.do_stride_h;
    dot = dot8<T>(*reinterpret_cast<const uint4*>(o + col), *reinterpret_cast<const uint4*>(d + col));
  }
  dot = lane_group_sum<kLanes>(dot);
  if (col == 0) {
    p.delta[r] = dot;
    const float lse =
        real_row ? f.lse[lse_offset<true>(f, batch, seq.q_start, head, row)] : neg_inf();
    p.lse_log2[r] = lse == neg_inf() ? -neg_inf() : lse * kLog2e;
  }
  // Every padded row's head_dim floats, whichever layout the accumulator has: the rows of a
  // (sequence, head) are one contiguous range in both.
  if (p.dq_accum != nullptr && col < HeadDim) {
    float4* acc = reinterpret_cast<float4*>(p.dq_accum + r * HeadDim + col);
    acc[0] = acc[1] = make_float4(0.f, 0.f, 0.f, 0.f);
  }
}

// The sink joins each row's softmax as one more logit with no value: P_sink = exp(sink - lse),
// and dL/dsink = Σ_rows P_sink (0 - delta). Rows past seqlen_q have lse_log2 = +inf (P_sink 0);
// a row that saw no key has O = 0, so delta 0. Each thread sums a fixed stride of the rows, then
// a fixed tree: the same bits every run.
template <typename T, int HeadDim>
__global__ void __launch_bounds__(BwdRowsShape::kThreads) bwd_sink_kernel(const BackwardParams p) {
  begin_after_previous_grid();
  const int head = blockIdx.x;
  const float sink_log2 = __ldg(p.fwd.sink_logits + head) * kLog2e;
  float sum = 0.f;
  for (int b = 0; b < p.fwd.batch; ++b) {
    const SequenceSpan seq = sequence_span(p.fwd, b);
    const long long first = WorkspaceRows(p, seq, b, head).first;
    for (int row = threadIdx.x; row < seq.seqlen_q; row += BwdRowsShape::kThreads)
      sum = fmaf(exp2_ftz(sink_log2 - p.lse_log2[first + row]), p.delta[first + row], sum);
  }
  __shared__ float warp_sums[BwdRowsShape::kWarps];
  sum = warp_sum(sum);
  if (threadIdx.x % 32 == 0) warp_sums[threadIdx.x / 32] = sum;
  __syncthreads();
  if (threadIdx.x == 0) {
    float total = 0.f;
#pragma unroll
    for (int w = 0; w < BwdRowsShape::kWarps; ++w) total += warp_sums[w];
    p.dsink[head] = 0.f - total;  // +0, not -0, when no row counts
  }
}

// Eight accumulator floats, scaled, as 16 bytes of dq.
template <typename T>
__device__ __forceinline__ void store8(T* dq, float scale, float2 c0, float2 c1, float2 c2,
                                       float2 c3) {
  *reinterpret_cast<uint4*>(dq) =
      make_uint4(pack2<T>(c0.x * scale, c0.y * scale), pack2<T>(c1.x * scale, c1.y * scale),
                 pack2<T>(c2.x * scale, c2.y * scale), pack2<T>(c3.x * scale, c3.y * scale));
}

template <typename T, int HeadDim>
__global__ void __launch_bounds__(BwdRowsShape::kThreads)
    bwd_convert_kernel(const BackwardParams p) {
  begin_after_previous_grid();
  constexpr int kSide = BwdRowsShape::kConvertSide;
  constexpr int kColumnBlocks = BwdRowsShape::convert_column_blocks(HeadDim);
  static_assert(BwdWorkspaceRows::kRowQuantum % kSide == 0, "whole blocks of padded rows");
  static_assert(BwdRowsShape::kThreads * 16 == kSide * kSide, "16 floats a thread");
  const int row0 = blockIdx.x / kColumnBlocks * kSide;
  const int col0 = blockIdx.x % kColumnBlocks * kSide;
  const int head = blockIdx.y, batch = blockIdx.z, t = threadIdx.x;
  const SequenceSpan seq = sequence_span(p.fwd, batch);
  if (row0 >= seq.seqlen_q) return;
  const long long first = WorkspaceRows(p, seq, batch, head).first + row0;
  T* dq = static_cast<T*>(p.dq) + seq.q_batch * p.dq_stride_b +
          (seq.q_start + static_cast<long long>(row0)) * p.dq_stride_s + head * p.dq_stride_h;
  const int rows = min(kSide, seq.seqlen_q - row0);
  const float scale = p.dscore_scale;
  if constexpr (HeadDim % kSide == 0) {
    if (p.dq_accum_blocks) {
      const float4* run = reinterpret_cast<const float4*>(
          p.dq_accum + BwdDqBlocks::offset(first, col0, HeadDim) + BwdRowsShape::convert_run(t));
      const float4 a = run[0], b = run[1], c = run[2], d = run[3];
      const int row = BwdRowsShape::convert_row(t), col = col0 + BwdRowsShape::convert_column(t);
      if (row < rows)
        store8<T>(dq + row * p.dq_stride_s + col, scale, make_float2(a.x, a.y),
                  make_float2(b.x, b.y), make_float2(c.x, c.y), make_float2(d.x, d.y));
      if (row + 8 < rows)
        store8<T>(dq + (row + 8) * p.dq_stride_s + col, scale, make_float2(a.z, a.w),
                  make_float2(b.z, b.w), make_float2(c.z, c.w), make_float2(d.z, d.w));
      return;
    }
  }
  // Row-major: thread t's 8 columns of rows t / 8 and t / 8 + 32.
  const int col = col0 + 8 * (t % 8);
  if (col >= HeadDim) return;
#pragma unroll
  for (int half = 0; half < 2; ++half) {
    const int row = t / 8 + 32 * half;
    if (row >= rows) break;
    const float4* src = reinterpret_cast<const float4*>(p.dq_accum + (first + row) * HeadDim + col);
    const float4 a = src[0], b = src[1];
    store8<T>(dq + row * p.dq_stride_s + col, scale, make_float2(a.x, a.y), make_float2(a.z, a.w),
              make_float2(b.x, b.y), make_float2(b.z, b.w));
  }
}

}  // namespace flashjit

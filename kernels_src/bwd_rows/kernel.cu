// The backward pass's row passes, one warp per (query row, head, batch), for equal-length and
// varlen batches alike (cu_seqlens_q read at run time: these passes are cheap):
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

template <typename T, int HeadDim>
__global__ void __launch_bounds__(BwdRowsShape::kThreads) bwd_prep_kernel(const BackwardParams p) {
  const int row = blockIdx.x * BwdRowsShape::kWarps + threadIdx.x / 32;
  const int head = blockIdx.y, batch = blockIdx.z, lane = threadIdx.x % 32;
  const FmhaParams& f = p.fwd;
  const SequenceSpan seq = sequence_span(f, batch);
  const WorkspaceRows rows(p, seq, batch, head);
  if (row >= rows.padded) return;
  const long long r = rows.first + row;
  float dot = 0.f;
  if (row < seq.seqlen_q) {
    const long long q_row = seq.q_start + row;
    const T* o = static_cast<const T*>(f.o) + seq.q_batch * f.o_stride_b + q_row * f.o_stride_s +
                 head * f.o_stride_h;
    const T* d = static_cast<const T*>(p.dout) + seq.q_batch * p.do_stride_b +
                 q_row * p.do_stride_s + head * p.do_stride_h;
#pragma unroll
    for (int c = 2 * lane; c < HeadDim; c += 64) {
      float o0, o1, d0, d1;
      unpack2<T>(*reinterpret_cast<const unsigned*>(o + c), o0, o1);
      unpack2<T>(*reinterpret_cast<const unsigned*>(d + c), d0, d1);
      dot = fmaf(o0, d0, fmaf(o1, d1, dot));
    }
  }
  dot = warp_sum(dot);
  if (lane == 0) {
    p.delta[r] = dot;
    const float lse =
        row < seq.seqlen_q ? f.lse[lse_offset<true>(f, batch, seq.q_start, head, row)] : neg_inf();
    p.lse_log2[r] = lse == neg_inf() ? -neg_inf() : lse * kLog2e;
  }
  if (p.dq_accum != nullptr) {
    float4* acc = reinterpret_cast<float4*>(p.dq_accum + r * HeadDim);
    for (int c = lane; c < HeadDim / 4; c += 32) acc[c] = make_float4(0.f, 0.f, 0.f, 0.f);
  }
}

// The sink joins each row's softmax as one more logit with no value: P_sink = exp(sink - lse),
// and dL/dsink = Σ_rows P_sink (0 - delta). Rows past seqlen_q have lse_log2 = +inf (P_sink 0);
// a row that saw no key has O = 0, so delta 0. Each thread sums a fixed stride of the rows, then
// a fixed tree: the same bits every run.
template <typename T, int HeadDim>
__global__ void __launch_bounds__(BwdRowsShape::kThreads) bwd_sink_kernel(const BackwardParams p) {
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

template <typename T, int HeadDim>
__global__ void __launch_bounds__(BwdRowsShape::kThreads)
    bwd_convert_kernel(const BackwardParams p) {
  const int row = blockIdx.x * BwdRowsShape::kWarps + threadIdx.x / 32;
  const int head = blockIdx.y, batch = blockIdx.z, lane = threadIdx.x % 32;
  const SequenceSpan seq = sequence_span(p.fwd, batch);
  if (row >= seq.seqlen_q) return;
  const long long accum_row = WorkspaceRows(p, seq, batch, head).first + row;
  T* dq = static_cast<T*>(p.dq) + seq.q_batch * p.dq_stride_b +
          (seq.q_start + static_cast<long long>(row)) * p.dq_stride_s + head * p.dq_stride_h;
  const float scale = p.dscore_scale;
#pragma unroll
  for (int c = 2 * lane; c < HeadDim; c += 64) {
    // Columns c, c + 1 lie side by side in either order (BwdDqBlocks: elements 2 h, 2 h + 1).
    const long long at = p.dq_accum_blocks ? BwdDqBlocks::offset(accum_row, c, HeadDim)
                                           : accum_row * HeadDim + c;
    const float2 pair = *reinterpret_cast<const float2*>(p.dq_accum + at);
    *reinterpret_cast<unsigned*>(dq + c) = pack2<T>(pair.x * scale, pair.y * scale);
  }
}

}  // namespace flashjit

// The argument block every fmha kernel takes by value. Plain C++: the host (src/core/problem.hpp)
// fills this very struct, so the two sides cannot disagree on its layout.
#pragma once

namespace flashjit {

struct FmhaParams {
  const void* q;  // [batch, seqlen_q, heads_q, head_dim], strides below, unit stride in head_dim
  const void* k;  // [batch, seqlen_k, heads_kv, head_dim]
  const void* v;  // [batch, seqlen_k, heads_kv, head_dim]
  void* o;        // [batch, seqlen_q, heads_q, head_dim]
  float* lse;     // optional [batch, heads_q, seqlen_q], natural log; nullptr: not written
  long long q_stride_b, q_stride_s, q_stride_h;  // in elements
  long long k_stride_b, k_stride_s, k_stride_h;
  long long v_stride_b, v_stride_s, v_stride_h;
  long long o_stride_b, o_stride_s, o_stride_h;
  int batch, heads_q, heads_kv, seqlen_q, seqlen_k;
  int heads_per_kv;    // heads_q / heads_kv (GQA group size)
  float scale_log2;    // softmax_scale * log2(e): scores go straight into exp2
  float softmax_scale; // kept for the natural-log LSE
};

}  // namespace flashjit

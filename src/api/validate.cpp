#include "api/validate.hpp"

#include <fmt/format.h>
#include <fmt/ranges.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <limits>
#include <utility>
#include <vector>

#include "api/view_checks.hpp"
#include "families/registry.hpp"
#include "merge/shape.cuh"

namespace flashjit::detail {
namespace {

constexpr int kMaxSplits = MergeShape::kMaxStates;
// Sequence lengths (and packed totals) of at most 2^30 leave int32 room for the kernels' and
// plans' tile arithmetic (length + tile - 1, band sums); far beyond any model's context.
constexpr std::int64_t kMaxSeqlen = std::int64_t{1} << 30;

void check_seqlen(const char* what, std::int64_t length) {
  if (length > kMaxSeqlen)
    reject(fmt::format("{} is {}: expected at most 2^30 ({})", what, length, kMaxSeqlen));
}
constexpr std::uintptr_t kWorkspaceAlignment = 256;

// The optional int32 device arrays: 4-byte aligned.
void check_int_array(const char* name, const void* data) {
  if (data != nullptr && reinterpret_cast<std::uintptr_t>(data) % 4 != 0)
    reject(fmt::format("{} ({}) is not 4-byte aligned: expected an int32 device array", name,
                       data));
}

// A paged cache's page table and pages against q; returns the key capacity per sequence.
int check_pages(std::int64_t batch, const KVCache& kv) {
  check_int_array("kv.page_table", kv.page_table);
  const std::int64_t page_size = kv.k.shape[1];
  if (page_size <= 0 || page_size % 8 != 0)
    reject(fmt::format("kv.k.shape[1] (page_size) is {}: expected a positive multiple of 8",
                       page_size));
  if (kv.k.shape[0] <= 0)
    reject(fmt::format("kv.k.shape[0] (num_pages) is {}: expected at least 1 page",
                       kv.k.shape[0]));
  if (kv.pages_per_seq <= 0)
    reject(fmt::format("kv.pages_per_seq is {}: expected at least 1 page table column",
                       kv.pages_per_seq));
  if (kv.page_table_stride < kv.pages_per_seq)
    reject(fmt::format("kv.page_table_stride is {}: expected at least kv.pages_per_seq ({})",
                       kv.page_table_stride, kv.pages_per_seq));
  std::int64_t entries = 0;
  if (__builtin_mul_overflow(batch, kv.page_table_stride, &entries) ||
      entries > std::numeric_limits<std::int32_t>::max())
    reject(fmt::format("kv.page_table has batch ({}) x page_table_stride ({}) entries: expected "
                       "fewer than 2^31",
                       batch, kv.page_table_stride));
  std::int64_t capacity = 0;
  if (__builtin_mul_overflow(kv.pages_per_seq, page_size, &capacity) || capacity > kMaxSeqlen)
    reject(fmt::format("kv.pages_per_seq ({}) x page_size ({}) keys: expected at most 2^30 ({})",
                       kv.pages_per_seq, page_size, kMaxSeqlen));
  return static_cast<int>(capacity);
}

// A varlen batch against its packed views: q (and out) [1, total_q, ...], a dense k and v
// [1, total_k, ...] with cu_seqlens_k, a paged cache without.
void check_varlen(const TensorView& q, const KVCache& kv, const VarlenBatch& varlen) {
  if (varlen.batch < 0)
    reject(fmt::format("varlen.batch is {}: expected the number of sequences (>= 0)",
                       varlen.batch));
  if (varlen.batch == 0) return;
  if (q.shape[0] != 1)
    reject(fmt::format("q.shape[0] is {}: expected 1 for a varlen batch (packed [1, total_q, "
                       "heads, head_dim])",
                       q.shape[0]));
  if (varlen.cu_seqlens_q == nullptr)
    reject("varlen.cu_seqlens_q is null: expected int32 [batch + 1] on the device");
  check_int_array("varlen.cu_seqlens_q", varlen.cu_seqlens_q);
  // 0 only when there is no query at all (a no-op).
  if (varlen.max_seqlen_q < (q.shape[1] > 0 ? 1 : 0) || varlen.max_seqlen_q > q.shape[1])
    reject(fmt::format("varlen.max_seqlen_q is {}: expected the longest query sequence, 1 to "
                       "total_q ({})",
                       varlen.max_seqlen_q, q.shape[1]));
  if (kv.is_paged()) {
    if (varlen.cu_seqlens_k != nullptr)
      reject("varlen.cu_seqlens_k is set for a paged cache: expected null (sequence lengths "
             "come from kv.seqused_k, else the page table's capacity)");
    return;
  }
  if (kv.k.shape[0] != 1)
    reject(fmt::format("k.shape[0] is {}: expected 1 for a varlen batch (packed [1, total_k, "
                       "heads, head_dim])",
                       kv.k.shape[0]));
  if (varlen.cu_seqlens_k == nullptr)
    reject("varlen.cu_seqlens_k is null: expected int32 [batch + 1] on the device for a dense "
           "cache");
  check_int_array("varlen.cu_seqlens_k", varlen.cu_seqlens_k);
  if (varlen.max_seqlen_k < 1 || varlen.max_seqlen_k > kv.k.shape[1])
    reject(fmt::format("varlen.max_seqlen_k is {}: expected the longest key sequence, 1 to "
                       "total_k ({})",
                       varlen.max_seqlen_k, kv.k.shape[1]));
}

}  // namespace

ForwardProblem validate_forward(const TensorView& q, const KVCache& kv, const TensorView& out,
                                const VarlenBatch* varlen, const ForwardOptions& options,
                                OutView out_view) {
  const TensorView& k = kv.k;
  const TensorView& v = kv.v;
  const bool paged = kv.is_paged();
  if (!paged && kv.pages_per_seq != 0)
    reject(fmt::format("kv.pages_per_seq is {} but kv.page_table is null: expected a page table "
                       "for a paged cache (or pages_per_seq 0 for a dense one)",
                       kv.pages_per_seq));
  check_view("q", q, q.dtype);
  check_view(paged ? "kv.k" : "k", k, q.dtype);
  check_view(paged ? "kv.v" : "v", v, q.dtype);
  check_view("out", out, q.dtype);
  if (out_view == OutView::written) check_output_view("out", out);
  for (int dim = 0; dim < 4; ++dim) expect_dim("out", out, dim, q.shape[dim], "the same as q");
  if (!paged && varlen == nullptr) expect_dim("k", k, 0, q.shape[0], "q's batch");
  check_seqlen(varlen != nullptr ? "q.shape[1] (total_q)" : "q.shape[1] (seqlen_q)", q.shape[1]);
  if (!paged)
    check_seqlen(varlen != nullptr ? "k.shape[1] (total_k)" : "k.shape[1] (seqlen_k)", k.shape[1]);
  if (varlen != nullptr) check_varlen(q, kv, *varlen);
  const std::int64_t batch = varlen != nullptr ? varlen->batch : q.shape[0];
  expect_dim(paged ? "kv.k" : "k", k, 3, q.shape[3], "q's head_dim");
  for (int dim = 0; dim < 4; ++dim)
    expect_dim(paged ? "kv.v" : "v", v, dim, k.shape[dim], "the same as k");
  check_int_array("kv.seqused_k", kv.seqused_k);

  const std::vector<int>& dims = head_dims_of_all_families();
  if (std::find(dims.begin(), dims.end(), q.shape[3]) == dims.end())
    reject(fmt::format("head_dim (q.shape[3]) is {}: expected one of {}", q.shape[3],
                       fmt::join(dims, ", ")));
  ForwardProblem problem;
  problem.dtype = q.dtype;
  problem.batch = static_cast<int>(batch);
  problem.seqlen_q = varlen != nullptr ? varlen->max_seqlen_q : static_cast<int>(q.shape[1]);
  problem.heads_q = static_cast<int>(q.shape[2]);
  problem.head_dim = static_cast<int>(q.shape[3]);
  problem.seqlen_k = paged               ? check_pages(batch, kv)
                     : varlen != nullptr ? varlen->max_seqlen_k
                                         : static_cast<int>(k.shape[1]);
  problem.varlen = varlen != nullptr;
  problem.total_q = static_cast<int>(q.shape[1]);
  problem.total_k = paged ? 0 : static_cast<int>(k.shape[1]);
  problem.heads_kv = static_cast<int>(k.shape[2]);
  problem.causal = options.causal;
  problem.paged = paged;
  problem.page_size = paged ? static_cast<int>(k.shape[1]) : 0;
  problem.num_pages = paged ? static_cast<int>(k.shape[0]) : 0;
  problem.has_seqused = kv.seqused_k != nullptr;
  if (options.num_splits < 0 || options.num_splits > kMaxSplits)
    reject(fmt::format("options.num_splits is {}: expected 0 (the heuristic) or 1 to {}",
                       options.num_splits, kMaxSplits));
  problem.num_splits = options.num_splits;
  if (options.workspace != nullptr &&
      reinterpret_cast<std::uintptr_t>(options.workspace) % kWorkspaceAlignment != 0)
    reject(fmt::format("options.workspace ({}) is not {}-byte aligned", options.workspace,
                       kWorkspaceAlignment));
  if (problem.heads_q > 0 && problem.heads_kv == 0)
    reject("k.shape[2] (heads) is 0: expected at least 1 key/value head");
  if (problem.heads_kv > 0 && problem.heads_q % problem.heads_kv != 0)
    reject(
        fmt::format("q heads ({}) is not a multiple of k/v heads ({}): expected heads_q = n * "
                    "heads_kv (GQA/MQA)",
                    problem.heads_q, problem.heads_kv));
  constexpr int kMaxGridDim = 65535;  // heads and batch index the grid's y and z
  if (problem.heads_q > kMaxGridDim || problem.batch > kMaxGridDim)
    reject(fmt::format("batch ({}) and heads ({}) must each be at most {}", problem.batch,
                       problem.heads_q, kMaxGridDim));
  if (problem.seqlen_k == 0 && !problem.empty())
    reject("k.shape[1] (seqlen_k) is 0: expected at least 1 key when seqlen_q > 0");

  problem.softmax_scale = options.softmax_scale.value_or(1.0f / std::sqrt(float(problem.head_dim)));
  // Kernels exponentiate in base 2 with the scale times log2(e), which must be finite too.
  if (!std::isfinite(problem.softmax_scale) || problem.softmax_scale <= 0.f ||
      !std::isfinite(problem.softmax_scale * kLog2e))
    reject(fmt::format("softmax_scale is {}: expected a finite value > 0 and below {:.3g}",
                       problem.softmax_scale, std::numeric_limits<float>::max() / kLog2e));
  problem.softcap = options.softcap;
  if (!std::isfinite(problem.softcap) || problem.softcap < 0.f ||
      (problem.softcap > 0.f && !std::isfinite(problem.softmax_scale / problem.softcap)))
    reject(fmt::format("softcap is {}: expected 0 (off) or a finite value > 0", problem.softcap));
  if (options.window_left < -1 || options.window_right < -1)
    reject(fmt::format("window_left / window_right are {} / {}: expected -1 (unbounded) or >= 0",
                       options.window_left, options.window_right));
  if (problem.causal && options.window_right > 0)
    reject(fmt::format("window_right is {} with causal: expected -1 or 0 (causal bounds the right "
                       "side at the diagonal)",
                       options.window_right));
  problem.window = options.window_left >= 0 || (options.window_right >= 0 && !problem.causal);
  if (options.sink_tokens < 0)
    reject(fmt::format("sink_tokens is {}: expected 0 (none) or more", options.sink_tokens));
  if (options.sink_tokens > 0 && options.window_left < 0)
    reject(fmt::format("sink_tokens is {} with window_left {}: sink tokens need a sliding window "
                       "bounded on the left (window_left >= 0)",
                       options.sink_tokens, options.window_left));
  if (options.lse != nullptr && reinterpret_cast<std::uintptr_t>(options.lse) % 4 != 0)
    reject("lse is not 4-byte aligned: expected a float* device buffer");
  problem.sink = options.sink_logits != nullptr;
  if (problem.sink && reinterpret_cast<std::uintptr_t>(options.sink_logits) % 4 != 0)
    reject("sink_logits is not 4-byte aligned: expected a device buffer of heads_q floats");
  problem.alibi = options.alibi_slopes != nullptr;
  if (problem.alibi && reinterpret_cast<std::uintptr_t>(options.alibi_slopes) % 4 != 0)
    reject("alibi_slopes is not 4-byte aligned: expected a device buffer of heads_q floats");

  if (const UserFunctions* functions = options.user_functions) {
    problem.user_functions = functions->hash();
    problem.score_mod = functions->has_score_mod();
    problem.mask_mod = functions->has_mask_mod();
  } else {
    for (int i = 0; i < kMaxUserArgs; ++i)
      if (options.user_args[i] != nullptr)
        reject(fmt::format("user_args[{}] is set without user_functions: expected user functions "
                           "that read it, or null",
                           i));
  }
  problem.block_mask = options.block_mask != nullptr;
  if (problem.block_mask && !problem.mask_mod)
    reject("block_mask is set without a mask_mod: expected user_functions with the mask_mod the "
           "block mask was built from");

  FmhaParams& p = problem.params;
  p.q = q.data;
  p.k = k.data;
  p.v = v.data;
  p.o = out.data;
  p.lse = options.lse;
  p.sink_logits = options.sink_logits;
  p.alibi_slopes = options.alibi_slopes;
  p.q_stride_b = q.stride[0], p.q_stride_s = q.stride[1], p.q_stride_h = q.stride[2];
  p.k_stride_b = k.stride[0], p.k_stride_s = k.stride[1], p.k_stride_h = k.stride[2];
  p.v_stride_b = v.stride[0], p.v_stride_s = v.stride[1], p.v_stride_h = v.stride[2];
  p.o_stride_b = out.stride[0], p.o_stride_s = out.stride[1], p.o_stride_h = out.stride[2];
  p.batch = problem.batch;
  p.heads_q = problem.heads_q;
  p.heads_kv = problem.heads_kv;
  p.seqlen_q = problem.seqlen_q;
  p.seqlen_k = problem.seqlen_k;
  p.heads_per_kv = problem.heads_kv > 0 ? problem.heads_q / problem.heads_kv : 1;
  p.softmax_scale = problem.softmax_scale;
  p.scale_log2 = problem.softmax_scale * kLog2e;
  if (problem.softcap > 0.f) {  // capped scores come out already scaled (params.cuh)
    p.softcap = problem.softcap;
    p.softcap_scale = problem.softmax_scale / problem.softcap;
    p.softmax_scale = 1.f;
    p.scale_log2 = kLog2e;
  }
  static_assert(kMaxUserArgs == kUserArgCount, "public and kernel argument counts");
  for (int i = 0; i < kMaxUserArgs; ++i) p.user_args.ptr[i] = options.user_args[i];
  if (problem.score_mod) {  // score_mod sees natural-log units (params.cuh)
    p.user_score_scale = problem.softcap > 0.f ? 1.f : p.softmax_scale;
    p.softmax_scale = 1.f;
    p.scale_log2 = kLog2e;
  }
  if (problem.window) {
    p.window_left = options.window_left < 0 ? kUnboundedWindow : options.window_left;
    p.window_right = problem.causal             ? 0
                     : options.window_right < 0 ? kUnboundedWindow
                                                : options.window_right;
    p.sink_tokens = options.sink_tokens;
  }
  p.page_table = kv.page_table;
  p.page_table_stride = paged ? kv.page_table_stride : 0;
  p.page_size = problem.page_size;
  p.seqused_k = kv.seqused_k;
  p.cu_seqlens_q = varlen != nullptr ? varlen->cu_seqlens_q : nullptr;
  p.cu_seqlens_k = varlen != nullptr ? varlen->cu_seqlens_k : nullptr;
  p.total_q = problem.total_q;
  p.num_splits = 1;
  return problem;
}

ForwardProblem validate_forward(const TensorView& q, const TensorView& k, const TensorView& v,
                                const TensorView& out, const ForwardOptions& options) {
  return validate_forward(q, KVCache::dense(k, v), out, nullptr, options);
}

MergeParams validate_merge(const TensorView& out_a, const float* lse_a, const TensorView& out_b,
                           const float* lse_b, const TensorView& out, float* lse_out) {
  check_view("out_a", out_a, out_a.dtype);
  check_view("out_b", out_b, out_a.dtype);
  check_view("out", out, out_a.dtype);
  check_output_view("out", out);
  for (int dim = 0; dim < 4; ++dim) {
    expect_dim("out_b", out_b, dim, out_a.shape[dim], "the same as out_a");
    expect_dim("out", out, dim, out_a.shape[dim], "the same as out_a");
    // b is read through a's strides; a dimension of extent 1 is never stepped along, so its
    // stride is free (PyTorch gives a slice of a batch-1 tensor the parent's stride[0]).
    if (out_a.shape[dim] > 1 && out_b.stride[dim] != out_a.stride[dim])
      reject(fmt::format("out_b.stride[{}] is {}: expected {} (the strides of out_a)", dim,
                         out_b.stride[dim], out_a.stride[dim]));
  }
  for (auto [name, lse] : {std::pair{"lse_a", lse_a}, std::pair{"lse_b", lse_b}}) {
    if (lse == nullptr) reject(fmt::format("{} is null: expected a float* device buffer", name));
    if (reinterpret_cast<std::uintptr_t>(lse) % 4 != 0)
      reject(fmt::format("{} is not 4-byte aligned: expected a float* device buffer", name));
  }
  if (lse_out != nullptr && reinterpret_cast<std::uintptr_t>(lse_out) % 4 != 0)
    reject("lse_out is not 4-byte aligned: expected a float* device buffer");
  const std::vector<int>& dims = head_dims_of_all_families();
  if (std::find(dims.begin(), dims.end(), out_a.shape[3]) == dims.end())
    reject(fmt::format("head_dim (out_a.shape[3]) is {}: expected one of {}", out_a.shape[3],
                       fmt::join(dims, ", ")));
  MergeParams m{};
  // The two states are read as one array of states: b at a + (b - a). Both are device addresses
  // of 16-bit (or fp32) elements, so the distance is a whole number of elements.
  const auto a_address = reinterpret_cast<std::intptr_t>(out_a.data);
  const auto b_address = reinterpret_cast<std::intptr_t>(out_b.data);
  m.o_in = out_a.data;
  m.o_stride_state = (b_address - a_address) / 2;  // bf16 and fp16 elements
  m.o_stride_b = out_a.stride[0], m.o_stride_s = out_a.stride[1], m.o_stride_h = out_a.stride[2];
  m.lse_in = lse_a;
  m.lse_stride_state = (reinterpret_cast<std::intptr_t>(lse_b) -
                        reinterpret_cast<std::intptr_t>(lse_a)) / static_cast<std::intptr_t>(sizeof(float));
  m.batch = static_cast<int>(out_a.shape[0]);
  m.seqlen = static_cast<int>(out_a.shape[1]);
  m.heads = static_cast<int>(out_a.shape[2]);
  m.lse_stride_b = static_cast<long long>(m.heads) * m.seqlen;
  m.lse_stride_h = m.seqlen;
  m.lse_stride_s = 1;
  m.o_out = out.data;
  m.lse_out = lse_out;
  m.out_stride_b = out.stride[0], m.out_stride_s = out.stride[1], m.out_stride_h = out.stride[2];
  m.num_states = 2;
  m.input_is_fp32 = 0;
  return m;
}

}  // namespace flashjit::detail

namespace flashjit {

TensorView TensorView::bshd(void* data, DType dtype, std::int64_t b, std::int64_t s, std::int64_t h,
                            std::int64_t d) {
  return {data, dtype, {b, s, h, d}, {s * h * d, h * d, d, 1}};
}

KVCache KVCache::dense(const TensorView& k, const TensorView& v, const std::int32_t* seqused_k) {
  KVCache kv;
  kv.k = k;
  kv.v = v;
  kv.seqused_k = seqused_k;
  return kv;
}

KVCache KVCache::paged(const TensorView& k_pages, const TensorView& v_pages,
                       const std::int32_t* page_table, std::int64_t pages_per_seq,
                       const std::int32_t* seqused_k) {
  KVCache kv = dense(k_pages, v_pages, seqused_k);
  kv.page_table = page_table;
  kv.pages_per_seq = pages_per_seq;
  kv.page_table_stride = pages_per_seq;
  return kv;
}

TensorView TensorView::bhsd(void* data, DType dtype, std::int64_t b, std::int64_t s, std::int64_t h,
                            std::int64_t d) {
  return {data, dtype, {b, s, h, d}, {h * s * d, d, s * d, 1}};
}

}  // namespace flashjit

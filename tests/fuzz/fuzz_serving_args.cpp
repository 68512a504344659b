// Fuzzes the serving forms of forward-argument validation: paged KV caches (page table, page
// size, pages per sequence, row stride, seqused_k), varlen batches (cu_seqlens, max lengths),
// and the options serving uses (split count, workspace, window, sink tokens, softcap, sinks,
// ALiBi), then the dispatch and split-KV plan an accepted problem gets on an H200. Every input
// is rejected with Error(invalid_argument) or accepted as a problem that keeps every documented
// rule, with a split workspace whose size is computed without overflow.
#include <fmt/format.h>

#include <cmath>
#include <cstddef>
#include <cstdint>
#include <string>

#include "api/dispatch.hpp"
#include "api/split_kv.hpp"
#include "api/validate.hpp"
#include "families/registry.hpp"
#include "flashjit/flashjit.hpp"
#include "fuzz_input.hpp"
#include "fuzz_views.hpp"
#include "invariant.hpp"
#include "merge/shape.cuh"

namespace flashjit::fuzz {
namespace {

bool aligned4(const void* p) { return reinterpret_cast<std::uintptr_t>(p) % 4 == 0; }

flashjit::DeviceInfo h200() {
  flashjit::DeviceInfo d;
  d.arch = "sm_90a";
  d.multiprocessors = 132;
  d.max_shared_per_block_optin = 227 * 1024;
  return d;
}

void check_accepted(const flashjit::detail::ForwardProblem& problem, const TensorView& q,
                    const KVCache& kv, const TensorView& out, const VarlenBatch* varlen,
                    const ForwardOptions& options) {
  check_accepted_view("q", q, q);
  check_accepted_view("out", out, q);
  check_accepted_view("k", kv.k, q);
  check_accepted_view("v", kv.v, q);
  invariant(out.shape == q.shape && kv.v.shape == kv.k.shape && kv.k.shape[3] == q.shape[3],
            "out, v or head_dim shaped unlike q / k but accepted");
  invariant(flashjit::fuzz::small_view_overlap_free(out), "out's elements overlap but accepted");
  invariant(problem.batch <= 65535 && problem.heads_q <= 65535, "grid limit exceeded");
  invariant(kv.seqused_k == nullptr || aligned4(kv.seqused_k), "misaligned seqused_k accepted");
  if (kv.is_paged()) {
    const std::int64_t page_size = kv.k.shape[1];
    invariant(aligned4(kv.page_table), "misaligned page table accepted");
    invariant(page_size > 0 && page_size % 8 == 0, "page_size not a positive multiple of 8");
    invariant(kv.k.shape[0] >= 1, "a paged cache without pages accepted");
    invariant(kv.pages_per_seq >= 1 && kv.page_table_stride >= kv.pages_per_seq,
              "page table columns or row stride accepted out of range");
    std::int64_t entries = 0, capacity = 0;
    invariant(!__builtin_mul_overflow(std::int64_t{problem.batch}, kv.page_table_stride,
                                      &entries) &&
                  !__builtin_mul_overflow(kv.pages_per_seq, page_size, &capacity) &&
                  capacity <= INT32_MAX,
              "a page table or capacity past its limits accepted");
    invariant(problem.seqlen_k == capacity && problem.paged &&
                  problem.page_size == page_size && problem.num_pages == kv.k.shape[0],
              "the problem does not mirror the paged cache");
  } else {
    invariant(kv.pages_per_seq == 0, "pages_per_seq set without a page table accepted");
  }
  if (varlen != nullptr && varlen->batch > 0) {
    invariant(q.shape[0] == 1 && varlen->cu_seqlens_q != nullptr &&
                  aligned4(varlen->cu_seqlens_q),
              "a varlen batch accepted over unpacked q or without cu_seqlens_q");
    invariant(varlen->max_seqlen_q >= (q.shape[1] > 0 ? 1 : 0) &&
                  varlen->max_seqlen_q <= q.shape[1],
              "max_seqlen_q outside [1, total_q] accepted");
    if (kv.is_paged()) {
      invariant(varlen->cu_seqlens_k == nullptr, "cu_seqlens_k accepted with a paged cache");
    } else {
      invariant(kv.k.shape[0] == 1 && varlen->cu_seqlens_k != nullptr &&
                    aligned4(varlen->cu_seqlens_k) && varlen->max_seqlen_k >= 1 &&
                    varlen->max_seqlen_k <= kv.k.shape[1],
                "a dense varlen cache accepted unpacked, without cu_seqlens_k or max_seqlen_k");
    }
  }
  if (problem.heads_q > 0)
    invariant(problem.heads_kv > 0 && problem.heads_q % problem.heads_kv == 0,
              "heads_q not a multiple of heads_kv accepted");
  invariant(problem.empty() || problem.seqlen_k > 0, "no keys accepted for a non-empty problem");
  invariant(std::isfinite(problem.params.scale_log2) && problem.params.scale_log2 > 0,
            "a scale whose log2 form is not finite accepted");
  invariant(options.num_splits >= 0 && options.num_splits <= flashjit::MergeShape::kMaxStates,
            "num_splits out of range accepted");
  invariant(options.workspace == nullptr ||
                reinterpret_cast<std::uintptr_t>(options.workspace) % 256 == 0,
            "misaligned workspace accepted");
  invariant(options.window_left >= -1 && options.window_right >= -1 && options.sink_tokens >= 0 &&
                (options.sink_tokens == 0 || options.window_left >= 0),
            "a window or sink tokens out of range accepted");
  invariant(std::isfinite(problem.softcap) && problem.softcap >= 0, "bad softcap accepted");
}

// The dispatch and split plan an accepted problem gets; unsupported is a fair answer (no family
// runs it), anything else must not happen, and the workspace must be what its parts make.
void check_plan(const flashjit::detail::ForwardProblem& problem) {
  if (problem.empty()) return;
  flashjit::Variant variant;
  try {
    variant = flashjit::detail::select_variant(problem, h200(), nullptr);
  } catch (const Error& error) {
    invariant(error.code() == ErrorCode::unsupported || error.code() == ErrorCode::invalid_argument,
              std::string("dispatch failed with an unexpected error: ") + error.what());
    return;
  }
  const auto plan = flashjit::detail::plan_splits(
      flashjit::detail::family_named(variant.family, "family"), variant, problem, h200());
  invariant(plan.num_splits >= 1 && plan.num_splits <= flashjit::MergeShape::kMaxStates,
            fmt::format("{} splits planned", plan.num_splits));
  if (plan.num_splits == 1) return;
  // Partial outputs: splits x batch x seqlen_q (the longest sequence's) x heads rows of
  // head_dim floats, then a float (LSE) per row.
  std::size_t rows = 0, floats = 0, bytes = 0;
  const bool fits =
      !__builtin_mul_overflow(static_cast<std::size_t>(plan.num_splits),
                              static_cast<std::size_t>(problem.batch), &rows) &&
      !__builtin_mul_overflow(rows, static_cast<std::size_t>(problem.seqlen_q), &rows) &&
      !__builtin_mul_overflow(rows, static_cast<std::size_t>(problem.heads_q), &rows) &&
      !__builtin_mul_overflow(rows, static_cast<std::size_t>(problem.head_dim + 1), &floats) &&
      !__builtin_mul_overflow(floats, sizeof(float), &bytes);
  invariant(fits, fmt::format("{}: the split workspace's size overflows", variant.name()));
  invariant(plan.workspace_bytes >= bytes && plan.lse_offset < plan.workspace_bytes,
            fmt::format("{}: a split workspace of {} bytes for {} bytes of partials",
                        variant.name(), plan.workspace_bytes, bytes));
}

}  // namespace

int test_one_input(const std::uint8_t* data, std::size_t size) {
  FuzzInput in(data, size);
  const DType dtype = in.flag() ? DType::fp16 : DType::bf16;
  const std::uint8_t form = in.byte();
  const bool paged = form & 1, use_varlen = form & 2;
  const TensorView q = fuzz_view(in, 0, dtype);
  TensorView out = q;
  out.data = fake_pointer(in, 3);
  KVCache kv;
  kv.k = fuzz_view(in, 1, dtype);
  kv.v = kv.k;
  kv.v.data = fake_pointer(in, 2);
  if (paged) {
    kv.page_table = static_cast<const std::int32_t*>(fake_pointer(in, 4));
    kv.pages_per_seq = in.integer();
    kv.page_table_stride = in.flag() ? kv.pages_per_seq : in.integer();
  }
  if (in.flag()) kv.seqused_k = static_cast<const std::int32_t*>(fake_pointer(in, 5));
  VarlenBatch varlen;
  if (use_varlen) {
    varlen.batch = static_cast<int>(in.integer());
    varlen.cu_seqlens_q = static_cast<const std::int32_t*>(fake_pointer(in, 6));
    if (in.flag()) varlen.cu_seqlens_k = static_cast<const std::int32_t*>(fake_pointer(in, 7));
    varlen.max_seqlen_q = static_cast<int>(in.integer());
    varlen.max_seqlen_k = static_cast<int>(in.integer());
  }
  ForwardOptions options;
  options.causal = in.flag();
  if (in.flag()) options.softmax_scale = in.raw<float>();
  if (in.flag()) options.num_splits = static_cast<int>(in.integer());
  if (in.flag()) options.workspace = fake_pointer(in, 8);
  if (in.flag()) {
    options.window_left = static_cast<int>(in.integer());
    options.window_right = static_cast<int>(in.integer());
    options.sink_tokens = static_cast<int>(in.integer());
  }
  if (in.flag()) options.softcap = in.raw<float>();
  if (in.flag()) options.sink_logits = static_cast<const float*>(fake_pointer(in, 9));
  if (in.flag()) options.alibi_slopes = static_cast<const float*>(fake_pointer(in, 10));

  flashjit::detail::ForwardProblem problem;
  const VarlenBatch* batch = use_varlen ? &varlen : nullptr;
  try {
    problem = flashjit::detail::validate_forward(q, kv, out, batch, options);
  } catch (const Error& error) {
    invariant(error.code() == ErrorCode::invalid_argument,
              std::string("rejection is not invalid_argument: ") + error.what());
    return 0;
  }
  check_accepted(problem, q, kv, out, batch, options);
  check_plan(problem);
  return 0;
}

}  // namespace flashjit::fuzz

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  return flashjit::fuzz::test_one_input(data, size);
}

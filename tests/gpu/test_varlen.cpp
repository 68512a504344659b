// Variable-length batches (VarlenBatch) on the GPU against the float64 reference: packed dense or
// paged caches through the decode families (sequences of length 0, refused batches, families that
// take none), prefill chunks over paged caches (wgmma on Hopper), and ragged prefill batches
// through the prefill kernel (wgmma on Hopper: its sorted schedule up to 256 sequences and the
// unsorted one past that, every tile shape it builds, seqused_k) and mma's varlen variants
// (forced, and the dispatcher's at head dims 32 and 96). Outputs and LSEs hold NaN before every
// run; so does every K/V slot that holds no valid key (varlen_problem.hpp), so a kernel that
// reads one into P·V shows.
#include <doctest/doctest.h>
#include <fmt/format.h>

#include <algorithm>
#include <functional>
#include <optional>
#include <random>
#include <string>
#include <utility>
#include <vector>

#include "compare.hpp"
#include "flashjit/device_memory.hpp"
#include "gpu.hpp"
#include "reference.hpp"
#include "serving_checks.hpp"
#include "varlen_problem.hpp"

using namespace flashjit;
using namespace flashjit::test;

namespace {

Engine& engine() { return shared_engine(); }

}  // namespace

// Variable-length batches (VarlenBatch): sequences of different query and key lengths packed
// along the seqlen dimension, each compared on its own against the float64 reference.
namespace {

// The family the dispatcher picks: mma at the head dims the decode and wgmma families have no
// kernels for (32, 96, 192); for more than 64 query rows per KV head (the max_seqlen_q hint x
// heads_q / heads_kv) unless split, the prefill kernel (wgmma on Hopper, mma elsewhere); decode_tma
// on Hopper for the rest but pages it gathers slower, decode elsewhere.
std::string dispatcher_family(const VarlenCase& c, const VarlenBatch& varlen,
                              const ForwardOptions& options) {
  const bool decode_dims = c.head_dim == 64 || c.head_dim == 128 || c.head_dim == 256;
  if (!decode_dims || !decode_has_head_dim(c.head_dim)) return "mma";
  const int rows_per_kv_head = varlen.max_seqlen_q * (c.heads_q / c.heads_kv);
  const bool hopper = engine().device().arch == "sm_90a";
  if (rows_per_kv_head > 64 && options.num_splits <= 1) return hopper ? "wgmma" : "mma";
  if (!hopper) return "decode";
  if (!c.paged()) return rows_per_kv_head > 64 ? "decode" : "decode_tma";  // split prefill: decode
  // decode_tma's TMA boxes: runs of 16 rows or more at d128, 64 at other head dims.
  return c.page_size % (c.head_dim == 128 ? 16 : 64) != 0 ? "decode" : "decode_tma";
}

std::string describe(const VarlenCase& c, const VarlenBatch& varlen,
                     const ForwardOptions& options) {
  return fmt::format("{} | hints q{} k{} | family {} num_splits {}", c.describe(),
                     varlen.max_seqlen_q, varlen.max_seqlen_k,
                     options.family.value_or("(dispatcher)"), options.num_splits);
}

// The batch with the loosest hints the host checks allow: every query row and every packed key.
VarlenBatch loose_hints(VarlenBatch varlen, const VarlenCase& c) {
  varlen.max_seqlen_q = c.total_q();
  if (!c.paged()) varlen.max_seqlen_k = c.total_k();
  return varlen;
}

struct VarlenRun {
  Variant variant;
  std::size_t workspace_bytes = 0;
  HostTensor out;
  std::vector<float> lse;
};

// Poisons the output and LSE, runs the varlen forward (options.causal and options.lse from the
// case) and downloads the result. nullopt when forward threw: Error(unsupported) for a head dim
// the decode family has no kernel for on this GPU, or for the decode family forced unsplit on a
// batch it leaves to the prefill families, is reported (MESSAGE), anything else fails.
std::optional<VarlenRun> run_varlen(VarlenDeviceProblem& p, const VarlenCase& c,
                                    const VarlenBatch& varlen, ForwardOptions options) {
  options.causal = c.causal;
  options.lse = p.lse();
  p.poison();
  VarlenRun run;
  try {
    const KVCache kv = p.kv();
    run.variant = engine().select_variant(p.q(), kv, p.out(), varlen, options);
    run.workspace_bytes = engine().workspace_bytes(p.q(), kv, p.out(), varlen, options);
    engine().forward(p.q(), kv, p.out(), varlen, options);
    synchronize(engine());
  } catch (const Error& e) {
    // The decode kernels leave prefill-sized batches, paged or not, to the prefill families
    // unless split (as dispatcher_family says).
    const int rows_per_kv_head = varlen.max_seqlen_q * (c.heads_q / c.heads_kv);
    const bool left_to_prefill = options.family == "decode" && rows_per_kv_head > 64 &&
                             options.num_splits <= 1;
    if (e.code() == ErrorCode::unsupported && (!decode_has_head_dim(c.head_dim) || left_to_prefill))
      MESSAGE(fmt::format("not run: {}: {}", describe(c, varlen, options), e.what()));
    else
      FAIL_CHECK(fmt::format("{}: {}", describe(c, varlen, options), e.what()));
    return std::nullopt;
  }
  run.out = p.output();
  run.lse = p.lse_values();
  return run;
}

// Each sequence against its float64 reference (check_varlen_against: the bounds, rows that see no
// key exactly 0 and -inf, what no sequence owns still poison), with as many rows without keys as
// the case has.
void check_varlen(const HostVarlen& host, const std::vector<Reference>& refs, const VarlenRun& r) {
  const VarlenCase& c = host.shape;
  const std::vector<int> empty = check_varlen_against(host, refs, r.out, r.lse);
  for (int b = 0; b < c.batch(); ++b) {
    CAPTURE(b);
    CHECK(empty[static_cast<std::size_t>(b)] == c.heads_q * c.rows_without_keys(b));
  }
}

void check_varlen_variant(const VarlenRun& r, const VarlenCase& c, const VarlenBatch& varlen,
                          const ForwardOptions& options) {
  if (options.family)
    CHECK(r.variant.family == *options.family);
  else
    CHECK(r.variant.family == dispatcher_family(c, varlen, options));
  CHECK(r.variant.paged == c.paged());
  // Per-sequence lengths are compiled into wgmma's and mma's varlen variants; the decode kernels
  // take them at run time.
  CHECK(r.variant.varlen == (r.variant.family == "wgmma" || r.variant.family == "mma"));
  CHECK(r.variant.causal == c.causal);
  CHECK(r.variant.dtype == c.dtype);
  CHECK(r.variant.head_dim == c.head_dim);
  // Partial results need scratch exactly when the keys are split.
  if (options.num_splits == 1) CHECK(r.workspace_bytes == 0);
  if (options.num_splits > 1) CHECK(r.workspace_bytes > 0);
}

// Each of `runs` with tight and loose max_seqlen hints, checked (check_varlen, the variant).
void check_runs(VarlenDeviceProblem& p, const HostVarlen& host, const std::vector<Reference>& refs,
                const std::vector<ForwardOptions>& runs) {
  const VarlenCase& c = host.shape;
  for (const VarlenBatch& varlen : {p.varlen(), loose_hints(p.varlen(), c)})
    for (const ForwardOptions& options : runs) {
      const std::string what = describe(c, varlen, options);
      CAPTURE(what);
      const auto r = run_varlen(p, c, varlen, options);
      if (!r) continue;
      const std::string variant = r->variant.name();
      CAPTURE(variant);
      check_varlen(host, refs, *r);
      check_varlen_variant(*r, c, varlen, options);
      MESSAGE(fmt::format("{:<45} {} workspace {} B", variant, what, r->workspace_bytes));
    }
}

// Every decode kernel and split count (heuristic, unsplit, 5).
void run_varlen_matrix(VarlenDeviceProblem& p, const HostVarlen& host,
                       const std::vector<Reference>& refs) {
  std::vector<ForwardOptions> runs;
  for (int splits : {0, 1, 5})
    for (const auto& kernel : decode_kernels()) {
      ForwardOptions options;
      options.num_splits = splits;
      options.family = kernel;
      runs.push_back(options);
    }
  check_runs(p, host, refs, runs);
}

// A shuffle of the query and key lengths (a fixed seed) in which a sequence with queries has no
// keys, one has more queries than keys (causal: its first rows see none), one has 64 or more of
// each and hundreds of keys, and the sequence without queries sits between two others.
std::pair<std::vector<int>, std::vector<int>> shuffled_lengths(std::vector<int> q,
                                                               std::vector<int> k, unsigned seed) {
  std::mt19937 rng(seed);
  auto index_of_zero = [](const std::vector<int>& lengths) {
    return std::find(lengths.begin(), lengths.end(), 0) - lengths.begin();
  };
  while (true) {
    std::shuffle(q.begin(), q.end(), rng);
    std::shuffle(k.begin(), k.end(), rng);
    const auto no_queries = index_of_zero(q);
    bool more_queries_than_keys = false, long_both = false;
    for (std::size_t b = 0; b < q.size(); ++b) {
      more_queries_than_keys = more_queries_than_keys || (q[b] > k[b] && k[b] > 0);
      long_both = long_both || (q[b] >= 64 && k[b] >= 300);
    }
    if (q[static_cast<std::size_t>(index_of_zero(k))] > 0 && more_queries_than_keys && long_both &&
        no_queries > 0 && no_queries + 1 < static_cast<std::ptrdiff_t>(q.size()))
      return {q, k};
  }
}

// forward, select_variant and workspace_bytes all refuse these arguments, naming one of `names`.
void check_varlen_refused(const std::string& what, const TensorView& q, const KVCache& kv,
                          const TensorView& out, const VarlenBatch& varlen,
                          const ForwardOptions& options, const std::vector<std::string>& names) {
  check_refused(
      what + " (forward)", [&] { engine().forward(q, kv, out, varlen, options); }, names);
  check_refused(
      what + " (select_variant)", [&] { engine().select_variant(q, kv, out, varlen, options); },
      names);
  check_refused(
      what + " (workspace_bytes)", [&] { engine().workspace_bytes(q, kv, out, varlen, options); },
      names);
}

}  // namespace

TEST_CASE("varlen: dense packed sequences of 0 to 200 queries and 0 to 777 keys, GQA 4:1") {
  const auto [seqlens_q, seqlens_k] =
      shuffled_lengths({0, 1, 63, 64, 65, 200, 1}, {5, 1, 64, 0, 300, 777, 129}, 8100);
  unsigned seed = 8110;
  for (bool padded : {false, true})
    for (bool causal : {false, true}) {
      VarlenCase c;
      c.heads_q = 8, c.heads_kv = 2, c.head_dim = 128, c.dtype = DType::bf16, c.causal = causal;
      c.seqlens_q = seqlens_q;
      c.seqlens_k = seqlens_k;
      if (padded) {
        // Strided q/out with gaps and rows past the last sequence; BHSD-strided K/V; seqused_k
        // above a sequence's keys (no cap), half, 0, one short and exact.
        c.head_padding = 8, c.row_padding = 16, c.tail_rows = 3, c.head_major = true;
        for (std::size_t b = 0; b < seqlens_k.size(); ++b) {
          const int keys = seqlens_k[b];
          const int used[] = {keys + 100, keys / 2, 0, std::max(keys - 1, 0), keys};
          c.seqused.push_back(used[b % 5]);
        }
      }
      std::mt19937 rng(seed++);
      const HostVarlen host = HostVarlen::random(c, rng);
      const std::vector<Reference> refs = host.reference();
      VarlenDeviceProblem p(engine(), host);
      run_varlen_matrix(p, host, refs);
    }
}

namespace {

// The paged cache of a varlen case and what the case computes.
struct PagedLayout {
  int page_size;
  bool hnd;
  int head_dim;
  DType dtype;
  bool causal;

  // heads_q query heads over 2 KV heads, pages for `keys` keys a sequence, `spare` pages more.
  VarlenCase paged_case(int heads_q, int keys, int spare) const {
    VarlenCase c;
    c.heads_q = heads_q, c.heads_kv = 2, c.head_dim = head_dim, c.dtype = dtype, c.causal = causal;
    c.page_size = page_size, c.head_major = hnd, c.spare_pages = spare;
    c.pages_per_seq = (keys + page_size - 1) / page_size;
    return c;
  }
};

}  // namespace

TEST_CASE("varlen: decode steps of 1 to 4 queries over paged caches with seqused_k, GQA 8:1") {
  const PagedLayout layouts[] = {{16, false, 64, DType::fp16, true},
                            {16, true, 256, DType::bf16, false},
                            {64, false, 256, DType::bf16, true},
                            {64, true, 64, DType::fp16, false}};
  unsigned seed = 8200;
  for (const PagedLayout& layout : layouts) {
    std::mt19937 rng(seed++);
    VarlenCase c = layout.paged_case(16, 3000, 3);
    // Every query length 1 to 4, keys from 1000 to 3000 (both ends included).
    c.seqlens_q = {1, 2, 3, 4, 1 + static_cast<int>(rng() % 4)};
    c.seqused = {1000, 3000, 1000 + static_cast<int>(rng() % 2001),
                 1000 + static_cast<int>(rng() % 2001), 1000 + static_cast<int>(rng() % 2001)};
    std::shuffle(c.seqlens_q.begin(), c.seqlens_q.end(), rng);
    std::shuffle(c.seqused.begin(), c.seqused.end(), rng);
    const HostVarlen host = HostVarlen::random(c, rng);
    const std::vector<Reference> refs = host.reference();
    VarlenDeviceProblem p(engine(), host);
    run_varlen_matrix(p, host, refs);
  }
}

TEST_CASE("varlen: prefill chunks of 0 to 300 queries over paged caches, pages of 16 to 256 rows") {
  // On Hopper wgmma reads every page size (the dispatcher's pick, checked): pages of 16, 24 and
  // 48 rows gathered, 64 and 256 in TMA runs. Forced: decode, mma (gathers rows on sm_80+).
  const PagedLayout layouts[] = {{16, false, 128, DType::bf16, true},
                            {24, true, 128, DType::bf16, true},
                            {48, true, 64, DType::fp16, false},
                            {64, false, 256, DType::bf16, true},
                            {256, true, 128, DType::fp16, false}};
  unsigned seed = 8250;
  for (const PagedLayout& layout : layouts) {
    std::mt19937 rng(seed++);
    VarlenCase c = layout.paged_case(8, 1500, 2);
    // Chunks around the 128-row query tile; a chunk longer than its keys (causal: rows without
    // any); a sequence of no queries between two others; keys up to the cache's capacity.
    c.seqlens_q = {1, 127, 0, 129, 300, 77};
    c.seqused = {40, 1, 700, 129, 200, c.pages_per_seq * c.page_size};
    const HostVarlen host = HostVarlen::random(c, rng);
    const std::vector<Reference> refs = host.reference();
    VarlenDeviceProblem p(engine(), host);
    std::vector<ForwardOptions> runs(3);
    runs[1].family = "decode";
    runs[2].family = "mma";
    if (engine().device().arch == "sm_90a") {
      runs.emplace_back().family = "wgmma";
      runs.emplace_back().num_splits = 3;  // split: decode_tma (or decode) instead
    }
    check_runs(p, host, refs, runs);
  }
}

TEST_CASE(
    "varlen: bad batches are refused, naming the field; nothing is written; batch 0 is a no-op") {
  VarlenCase dense_case;
  dense_case.heads_q = 4, dense_case.heads_kv = 2, dense_case.head_dim = 64;
  dense_case.seqlens_q = {2, 0, 4};   // total_q 6
  dense_case.seqlens_k = {10, 4, 0};  // total_k 14
  VarlenCase paged_case;
  paged_case.heads_q = 4, paged_case.heads_kv = 2, paged_case.head_dim = 64;
  paged_case.seqlens_q = {1, 3};
  paged_case.page_size = 16, paged_case.pages_per_seq = 2, paged_case.seqused = {20, 5};
  std::mt19937 rng(8300);
  const HostVarlen dense_host = HostVarlen::random(dense_case, rng);
  const HostVarlen paged_host = HostVarlen::random(paged_case, rng);
  VarlenDeviceProblem dense(engine(), dense_host), paged(engine(), paged_host);
  ForwardOptions options;
  options.lse = dense.lse();
  const VarlenBatch good = dense.varlen();
  const int total_q = dense_case.total_q(), total_k = dense_case.total_k();

  {
    // Two batches of three rows (out likewise, so only q's batch is wrong for a varlen batch).
    TensorView q = dense.q(), out = dense.out();
    for (TensorView* t : {&q, &out}) {
      t->shape[0] = 2, t->shape[1] = total_q / 2;
      t->stride[0] = t->shape[1] * t->stride[1];
    }
    VarlenBatch varlen = good;
    varlen.max_seqlen_q = std::min<int>(varlen.max_seqlen_q, total_q / 2);
    check_varlen_refused("q.shape[0] 2", q, dense.kv(), out, varlen, options, {"q.shape[0]"});
  }
  VarlenBatch bad = good;
  bad.cu_seqlens_q = nullptr;
  check_varlen_refused("cu_seqlens_q null", dense.q(), dense.kv(), dense.out(), bad, options,
                       {"cu_seqlens_q"});
  for (int hint : {0, total_q + 1}) {
    bad = good;
    bad.max_seqlen_q = hint;
    check_varlen_refused(fmt::format("max_seqlen_q {} of total_q {}", hint, total_q), dense.q(),
                         dense.kv(), dense.out(), bad, options, {"max_seqlen_q"});
  }
  bad = good;
  bad.max_seqlen_k = total_k + 1;
  check_varlen_refused(fmt::format("max_seqlen_k {} of total_k {}", total_k + 1, total_k),
                       dense.q(), dense.kv(), dense.out(), bad, options, {"max_seqlen_k"});
  bad = good;
  bad.cu_seqlens_k = nullptr;
  check_varlen_refused("dense cache without cu_seqlens_k", dense.q(), dense.kv(), dense.out(), bad,
                       options, {"cu_seqlens_k"});
  {
    // Two batches of seven keys.
    KVCache kv = dense.kv();
    for (TensorView* t : {&kv.k, &kv.v}) {
      t->shape[0] = 2, t->shape[1] = total_k / 2;
      t->stride[0] = t->shape[1] * t->stride[1];  // BSHD
    }
    bad = good;
    bad.max_seqlen_k = std::min<int>(bad.max_seqlen_k, total_k / 2);
    check_varlen_refused("k.shape[0] 2 (dense)", dense.q(), kv, dense.out(), bad, options,
                         {"k.shape[0]"});
  }
  for (int batch : {-1, -100}) {
    bad = good;
    bad.batch = batch;
    check_varlen_refused(fmt::format("batch {}", batch), dense.q(), dense.kv(), dense.out(), bad,
                         options, {"varlen.batch", "batch is"});
  }
  ForwardOptions paged_options;
  paged_options.lse = paged.lse();
  VarlenBatch paged_bad = paged.varlen();
  paged_bad.cu_seqlens_k = paged.cu_seqlens_k();
  check_varlen_refused("paged cache with cu_seqlens_k", paged.q(), paged.kv(), paged.out(),
                       paged_bad, paged_options, {"cu_seqlens_k"});
  synchronize(engine());
  for (const VarlenDeviceProblem* p : {&dense, &paged}) {
    CHECK_MESSAGE(all_poison(p->output()), "a refused call wrote the output");
    CHECK_MESSAGE(all_poison(p->lse_values()), "a refused call wrote the LSE");
  }

  // Batch 0: nothing to compute, with the hints as they were or 0 (every length there is).
  for (bool zero_hints : {false, true})
    for (int splits : {0, 5}) {
      ForwardOptions o = options;
      o.num_splits = splits;
      VarlenBatch empty = good;
      empty.batch = 0;
      if (zero_hints) empty.max_seqlen_q = empty.max_seqlen_k = 0;
      const std::string what = fmt::format("batch 0, hints q{} k{}, num_splits {}",
                                           empty.max_seqlen_q, empty.max_seqlen_k, splits);
      CAPTURE(what);
      try {
        CHECK(engine().workspace_bytes(dense.q(), dense.kv(), dense.out(), empty, o) == 0);
        engine().forward(dense.q(), dense.kv(), dense.out(), empty, o);
        VarlenBatch empty_paged = paged.varlen();
        empty_paged.batch = 0;
        if (zero_hints) empty_paged.max_seqlen_q = empty_paged.max_seqlen_k = 0;
        paged_options.num_splits = splits;
        engine().forward(paged.q(), paged.kv(), paged.out(), empty_paged, paged_options);
        synchronize(engine());
      } catch (const Error& e) {
        FAIL_CHECK(e.what());
      }
      for (const VarlenDeviceProblem* p : {&dense, &paged}) {
        CHECK_MESSAGE(all_poison(p->output()), "a forward of batch 0 wrote the output");
        CHECK_MESSAGE(all_poison(p->lse_values()), "a forward of batch 0 wrote the LSE");
      }
    }

  // The same problems, good, are run and right (so the refusals above were for what they name).
  for (auto [p, host] : {std::pair{&dense, &dense_host}, std::pair{&paged, &paged_host}}) {
    const VarlenCase& c = host->shape;
    CAPTURE(c.describe());
    if (const auto r = run_varlen(*p, c, p->varlen(), ForwardOptions{}))
      check_varlen(*host, host->reference(), *r);
  }
}

TEST_CASE("varlen: decode families run it, workspace only when split, other families refuse") {
  VarlenCase c;
  c.heads_q = 8, c.heads_kv = 2, c.head_dim = 128, c.causal = true;
  c.seqlens_q = {3, 0, 16, 1};  // 64 rows per KV head at most: decode-shaped
  c.seqlens_k = {700, 40, 0, 1500};
  std::mt19937 rng(8400);
  const HostVarlen host = HostVarlen::random(c, rng);
  const std::vector<Reference> refs = host.reference();
  VarlenDeviceProblem p(engine(), host);
  const VarlenBatch varlen = p.varlen();

  for (const auto& kernel : decode_kernels()) {
    ForwardOptions options;
    options.causal = c.causal;
    options.lse = p.lse();
    options.family = kernel;
    const std::string what = describe(c, varlen, options);
    CAPTURE(what);
    const Variant variant = engine().select_variant(p.q(), p.kv(), p.out(), varlen, options);
    CHECK(variant.family == kernel.value_or(variant.family));
    CHECK(variant.family.starts_with("decode"));
    CHECK_FALSE(variant.paged);
    if (!kernel && engine().device().arch == "sm_90a") CHECK(variant.family == "decode_tma");

    options.num_splits = 1;
    CHECK(engine().workspace_bytes(p.q(), p.kv(), p.out(), varlen, options) == 0);
    options.num_splits = 5;
    const std::size_t need = engine().workspace_bytes(p.q(), p.kv(), p.out(), varlen, options);
    CHECK(need > 0);
    options.num_splits = 0;
    MESSAGE(fmt::format("{}: {}; heuristic workspace {} B, 5 splits {} B", what, variant.name(),
                        engine().workspace_bytes(p.q(), p.kv(), p.out(), varlen, options), need));

    // Five splits through the caller's workspace of exactly the size asked for.
    if (need == 0) continue;
    DeviceBuffer workspace(engine(), need);
    options.num_splits = 5;
    options.workspace = workspace.data();
    options.workspace_bytes = need;
    if (const auto r = run_varlen(p, c, varlen, options)) {
      check_varlen(host, refs, *r);
      check_varlen_variant(*r, c, varlen, options);
    }
  }

  // The families without varlen batches refuse one, even when forced, and write nothing (wgmma
  // and mma take them: the prefill cases below).
  p.poison();
  for (const std::string& family : family_names()) {
    if (family.starts_with("decode") || family == "wgmma" || family == "mma") continue;
    ForwardOptions options;
    options.causal = c.causal;
    options.lse = p.lse();
    options.family = family;
    check_unsupported(family + " (forward)",
                      [&] { engine().forward(p.q(), p.kv(), p.out(), varlen, options); });
    check_unsupported(family + " (select_variant)",
                      [&] { engine().select_variant(p.q(), p.kv(), p.out(), varlen, options); });
    check_unsupported(family + " (workspace_bytes)",
                      [&] { engine().workspace_bytes(p.q(), p.kv(), p.out(), varlen, options); });
  }
  synchronize(engine());
  CHECK_MESSAGE(all_poison(p.output()), "a refused call wrote the output");
  CHECK_MESSAGE(all_poison(p.lse_values()), "a refused call wrote the LSE");
}

// Ragged prefill: the dispatcher's family (dispatcher_family), every wgmma shape on Hopper, and
// mma (sm_80 on) forced.
namespace {

// The wgmma tile shapes the tile table may pick for the case (each forced in turn), on Hopper.
std::vector<TileConfig> wgmma_shapes(const VarlenCase& c) {
  std::vector<TileConfig> shapes;
  if (engine().device().arch != "sm_90a") return shapes;
  for (const Variant& v : default_variants("sm_90a"))
    if (v.family == "wgmma" && v.head_dim == c.head_dim && v.causal == c.causal &&
        v.dtype == c.dtype)
      shapes.push_back({v.tile_m, v.tile_n, v.stages});
  return shapes;
}

// The dispatcher's choice, mma, and every wgmma shape.
void run_prefill_matrix(VarlenDeviceProblem& p, const HostVarlen& host,
                        const std::vector<Reference>& refs) {
  std::vector<ForwardOptions> runs(2);
  runs[1].family = "mma";
  for (const TileConfig& tiles : wgmma_shapes(host.shape)) {
    ForwardOptions options;
    options.family = "wgmma";
    options.tiles = tiles;
    runs.push_back(options);
  }
  check_runs(p, host, refs, runs);
}

// Fresh random inputs for the case, its float64 reference, and the matrix above.
void run_prefill_case(const VarlenCase& c, std::mt19937& rng) {
  const HostVarlen host = HostVarlen::random(c, rng);
  const std::vector<Reference> refs = host.reference();
  VarlenDeviceProblem p(engine(), host);
  run_prefill_matrix(p, host, refs);
}

}  // namespace

TEST_CASE(
    "varlen prefill: ragged batches of 0 to 1000 tokens (tile +-1 included), GQA 1:1 to 8:1") {
  struct Shape {
    int heads_q, heads_kv, head_dim;
    DType dtype;
    bool chunked;  // keys = queries + a cached prefix (causal: bottom-right per sequence)
  };
  const Shape shapes[] = {{4, 4, 64, DType::fp16, false},
                          {8, 2, 128, DType::bf16, true},
                          {8, 1, 256, DType::bf16, false},
                          {4, 2, 32, DType::bf16, true},
                          {6, 2, 96, DType::fp16, false}};
  unsigned seed = 8500;
  for (const Shape& shape : shapes)
    for (bool causal : {false, true}) {
      std::mt19937 rng(seed++);
      VarlenCase c;
      c.heads_q = shape.heads_q, c.heads_kv = shape.heads_kv, c.head_dim = shape.head_dim;
      c.dtype = shape.dtype, c.causal = causal;
      c.seqlens_q = {0, 1, 63, 64, 65, 127, 128, 129, 192, 193, 600, 1000};
      std::shuffle(c.seqlens_q.begin(), c.seqlens_q.end(), rng);
      for (int n : c.seqlens_q)
        c.seqlens_k.push_back(n + (shape.chunked ? static_cast<int>(rng() % 300) : 0));
      run_prefill_case(c, rng);
    }
}

TEST_CASE("varlen prefill: seqused_k below, at and above the packed keys; padded q and out") {
  std::mt19937 rng(8600);
  for (bool causal : {false, true}) {
    VarlenCase c;
    c.heads_q = 8, c.heads_kv = 2, c.head_dim = 128, c.causal = causal, c.dtype = DType::fp16;
    c.seqlens_q = {300, 0, 129, 64, 500};
    c.seqlens_k = {300, 50, 400, 1, 700};
    // seqused past the sequence's keys (no cap), none, short of them by a part tile, 0, and one
    // key less: the slots past each length are NaN, which P·V must never see.
    c.seqused = {1000, 50, 257, 0, 699};
    c.head_padding = 8, c.row_padding = 16, c.tail_rows = 5, c.head_major = true;
    run_prefill_case(c, rng);
  }
}

TEST_CASE("varlen prefill: 300 sequences (past the sorted schedule's 256) of 0 to 100 tokens") {
  std::mt19937 rng(8700);
  for (bool causal : {false, true}) {
    VarlenCase c;
    c.heads_q = 4, c.heads_kv = 2, c.head_dim = 64, c.causal = causal;
    for (int b = 0; b < 300; ++b) {
      c.seqlens_q.push_back(static_cast<int>(rng() % 101));
      c.seqlens_k.push_back(c.seqlens_q.back());
    }
    c.seqlens_q[7] = 0;  // at least one empty sequence between others
    run_prefill_case(c, rng);
  }
}

// The serving API on the GPU against the float64 reference: the decode family on dense caches
// under forced and heuristic split counts, ragged seqused_k (a sequence of length 0 included),
// paged KV caches (NHD and HND pages behind shuffled page tables), refused arguments,
// merge_attention_states, and warm paged decodes captured in CUDA graphs and replayed on new
// inputs (variable-length batches: test_varlen.cpp). Outputs and LSEs hold NaN before every run;
// so does every K/V slot that holds no valid key (kv_problem.hpp), so a kernel that reads one
// into P·V shows.
#include <doctest/doctest.h>
#include <fmt/format.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <functional>
#include <optional>
#include <random>
#include <string>
#include <utility>
#include <vector>

#include "compare.hpp"
#include "cuda_graph.hpp"
#include "flashjit/device_memory.hpp"
#include "gpu.hpp"
#include "kv_problem.hpp"
#include "numerics_case.hpp"  // row_is_zero
#include "reference.hpp"
#include "serving_checks.hpp"

using namespace flashjit;
using namespace flashjit::test;

namespace {

Engine& engine() { return shared_engine(); }

// The prefill family the dispatcher must pick for a paged cache (wgmma on Hopper, mma
// elsewhere), or "" where it leaves the case to the decode kernels.
std::string paged_prefill_expected(const KvCase& c, const ForwardOptions& options) {
  if (!c.paged()) return "";
  return paged_prefill_family(c.head_dim, c.page_size, c.rows_per_kv_head(), options.num_splits);
}

// Where the decode family must run a case, picked by the dispatcher or forced (every GPU from
// sm_80): every paged problem but the prefill families' above (which decode refuses even when
// forced, unless split), and every dense one with at most 64 query rows per KV head
// (seqlen_q x heads_q / heads_kv).
bool decode_expected(const KvCase& c, const ForwardOptions& options = {}) {
  return (c.paged() || c.rows_per_kv_head() <= 64) && decode_has_head_dim(c.head_dim) &&
         paged_prefill_expected(c, options).empty();
}

std::string describe(const KvCase& c, const ForwardOptions& options) {
  return fmt::format("{} | family {} num_splits {}", c.describe(),
                     options.family.value_or("(dispatcher)"), options.num_splits);
}

int lse_index(const KvCase& c, int b, int h, int i) { return (b * c.heads_q + h) * c.seqlen_q + i; }

bool same_bits(const std::vector<float>& a, const std::vector<float>& b) {
  return a.size() == b.size() && std::memcmp(a.data(), b.data(), a.size() * sizeof(float)) == 0;
}

// One forward over a KvDeviceProblem's KVCache, and what the engine said it would run.
struct KvRun {
  Variant variant;
  int num_splits = 0;
  std::size_t workspace_bytes = 0;
  HostTensor out;
  std::vector<float> lse;
};

// Poisons the output and LSE, runs forward (options.causal and options.lse set from the case)
// and downloads the result. nullopt when forward threw: Error(unsupported) is reported (MESSAGE)
// for a forced family other than decode and where decode is not expected; anything else fails.
std::optional<KvRun> run_kv(KvDeviceProblem& p, const KvCase& c, ForwardOptions options) {
  options.causal = c.causal;
  options.lse = p.lse();
  p.poison();
  KvRun run;
  try {
    const KVCache kv = p.kv();
    run.variant = engine().select_variant(p.q(), kv, p.out(), options);
    run.num_splits = engine().select_num_splits(p.q(), kv, p.out(), options);
    run.workspace_bytes = engine().workspace_bytes(p.q(), kv, p.out(), options);
    engine().forward(p.q(), kv, p.out(), options);
    synchronize(engine());
    // Once planned (never-block is off), what runs is what was selected.
    CHECK(engine().running_variant(p.q(), kv, p.out(), options) == run.variant);
  } catch (const Error& e) {
    const bool other_family = options.family && !options.family->starts_with("decode");
    if (e.code() == ErrorCode::unsupported && (other_family || !decode_expected(c, options)))
      MESSAGE(fmt::format("not run: {}: {}", describe(c, options), e.what()));
    else
      FAIL_CHECK(fmt::format("{}: {}", describe(c, options), e.what()));
    return std::nullopt;
  }
  run.out = p.output();
  run.lse = p.lse_values();
  return run;
}

// What select_num_splits and workspace_bytes report for a forward asked for `requested` splits.
void check_splits(const KvRun& r, int requested, const KvCase& c) {
  CHECK(r.num_splits >= 1);
  CHECK(r.num_splits <= 128);
  if (requested > 0) {
    CHECK(r.num_splits <= requested);
    // With hundreds of keys per split there is no reason to use fewer splits than asked.
    if (c.capacity >= 256 * requested) CHECK(r.num_splits == requested);
  }
  // Partial results need scratch exactly when the keys are split.
  CHECK((r.num_splits > 1) == (r.workspace_bytes > 0));
}

// The family the dispatcher (options.family unset) or the caller picked for the run.
void check_decode_variant(const KvRun& r, const KvCase& c, const ForwardOptions& options) {
  if (const std::string prefill = paged_prefill_expected(c, options);
      !options.family && !prefill.empty())
    CHECK(r.variant.family == prefill);
  if (options.family && !options.family->starts_with("decode"))
    CHECK(r.variant.family == *options.family);
  else if (decode_expected(c, options))
    CHECK(r.variant.family.starts_with("decode"));  // decode_tma on Hopper, decode elsewhere
  CHECK(r.variant.paged == c.paged());
}

// Runs the case on each of `kernels` (the decode kernels unless given) with each split count and
// hands every run that launched to `check` (the case and the variant are captured for its
// failures).
template <typename Check>
void for_each_decode_run(KvDeviceProblem& p, const KvCase& c, const std::vector<int>& split_counts,
                         Check&& check,
                         const std::vector<std::optional<std::string>>& kernels = decode_kernels()) {
  for (int splits : split_counts)
    for (const auto& kernel : kernels) {
      ForwardOptions options;
      options.num_splits = splits;
      options.family = kernel;
      const std::string what = describe(c, options);
      CAPTURE(what);
      const auto r = run_kv(p, c, options);
      if (!r) continue;
      const std::string variant = r->variant.name();
      CAPTURE(variant);
      check(*r, options, what, variant);
    }
}

// Each case on fresh random inputs (seeds `seed`, `seed` + 1, ...): hands `body` the case, its
// device problem and its float64 reference.
template <typename Body>
void for_each_random_case(const std::vector<KvCase>& cases, unsigned seed, Body&& body) {
  for (const KvCase& c : cases) {
    std::mt19937 rng(seed++);
    const HostKv host = HostKv::random(c, rng);
    const Reference ref = host.reference();
    KvDeviceProblem p(engine(), host);
    body(c, p, ref);
  }
}

KvCase dense(int b, int hq, int hkv, int sq, int sk, int d, bool causal, DType dtype = DType::bf16,
             bool bhsd = false) {
  KvCase c;
  c.batch = b, c.heads_q = hq, c.heads_kv = hkv, c.seqlen_q = sq, c.capacity = sk;
  c.head_dim = d, c.causal = causal, c.dtype = dtype, c.head_major = bhsd;
  return c;
}

// The case over a paged cache of `page_size`-row pages (HND where `hnd`), with these seqused_k.
KvCase with_pages(KvCase c, int page_size, std::vector<int> seqused, bool hnd = false) {
  c.page_size = page_size, c.head_major = hnd, c.seqused = std::move(seqused);
  return c;
}

// Keys [first, first + count) of a dense [b, s, h, d] view: the same strides, moved along s.
TensorView key_range(TensorView t, int first, int count) {
  t.data = static_cast<char*>(t.data) + first * t.stride[1] * 2;
  t.shape[1] = count;
  return t;
}

// One attention state (output and LSE of q's shape) in its own buffers, poisoned.
class State {
 public:
  State(const KvDeviceProblem& p, const HostKv& host)
      : view_(p.out()),
        lse_count_(host.q.bits.size() / static_cast<std::size_t>(host.shape.head_dim)),
        out_(engine(), host.q.bits.size() * 2),
        lse_(engine(), lse_count_ * sizeof(float)) {
    view_.data = out_.data();
    out_.fill_bytes(0xff);
    lse_.fill_bytes(0xff);
  }
  const TensorView& out() const { return view_; }
  float* lse() const { return static_cast<float*>(lse_.data()); }
  HostTensor output() const {
    HostTensor t;
    t.view = view_;
    t.view.data = nullptr;
    t.bits.resize(out_.size() / 2);
    out_.download(t.bits.data(), out_.size());
    return t;
  }
  std::vector<float> lse_values() const {
    std::vector<float> values(lse_count_);
    lse_.download(values.data(), values.size() * sizeof(float));
    return values;
  }

 private:
  TensorView view_;
  std::size_t lse_count_;  // batch * heads_q * seqlen_q
  DeviceBuffer out_, lse_;
};

}  // namespace

TEST_CASE("decode: dense caches, seqlen_q 1 to 16, GQA 1:1 to 8:1, forced and heuristic splits") {
  const std::vector<KvCase> cases = {
      dense(1, 1, 1, 1, 1, 128, false),     // one key
      dense(2, 4, 1, 1, 63, 64, true),      // 4:1, one key short of 64
      dense(1, 8, 2, 2, 64, 128, false),    // 4:1, exactly 64 keys
      dense(2, 8, 1, 4, 65, 256, true),     // 8:1, one key past 64
      dense(1, 8, 1, 8, 1, 128, true),      // 64 rows per KV head; 7 of 8 query rows see no key
      dense(1, 16, 2, 8, 1000, 128, true),  // 8:1 x 8 = 64 rows per KV head, the most decode takes
      dense(2, 4, 4, 16, 1000, 64, false),  // 1:1
      dense(1, 8, 2, 16, 5000, 128, true),  // 4:1 x 16 = 64 rows
      dense(1, 4, 1, 1, 5000, 256, false),  // one KV head of one sequence: only splits fill a GPU
      dense(2, 8, 8, 2, 5000, 64, true),    // MHA
      dense(1, 32, 4, 1, 3000, 128, true),  // 8:1, a Llama-style decode step
      dense(2, 8, 2, 4, 777, 128, true, DType::fp16),
      dense(1, 8, 2, 2, 1000, 128, false, DType::bf16, /*bhsd=*/true),
      dense(2, 2, 2, 16, 63, 256, true, DType::fp16),  // 16 queries against 63 keys, causal
      dense(1, 16, 2, 16, 1000, 128, true),  // 128 rows per KV head: not decode's, still right
      dense(2, 8, 2, 12, 3000, 128, true),   // 48 rows: a 64-row tile's second group half full
      dense(1, 8, 2, 16, 2000, 64, false),   // 64 rows at d64
  };
  for_each_random_case(cases, 7100, [&](const KvCase& c, KvDeviceProblem& p, const Reference& ref) {
    const bool decode = decode_expected(c);
    const std::vector<int> split_counts =
        decode ? std::vector<int>{1, 3, 17, 0} : std::vector<int>{0};
    for_each_decode_run(
        p, c, split_counts,
        [&](const KvRun& run, const ForwardOptions& options, const std::string& what,
            const std::string& variant) {
          check_against(run.out, run.lse, ref, c.dtype);
          check_splits(run, options.num_splits, c);
          check_decode_variant(run, c, options);
          // Unsplit, these would be a handful of CTAs on a GPU of 40 or more SMs.
          if (decode && options.num_splits == 0 && c.batch * c.heads_kv <= 4 &&
              c.capacity >= 1000 && engine().device().multiprocessors >= 40)
            CHECK_MESSAGE(run.num_splits > 1, "the heuristic does not split a long, narrow decode");
          MESSAGE(fmt::format("{:<45} {:<70} splits {}", variant, what, run.num_splits));
        });
    // The other attention families through the same KVCache entry point (dense, no seqused_k).
    for (const std::string& family : family_names()) {
      if (family.starts_with("decode")) continue;  // above
      ForwardOptions options;
      options.family = family;
      const std::string what = describe(c, options);
      CAPTURE(what);
      const auto r = run_kv(p, c, options);
      if (!r) continue;
      CHECK(r->variant.family == family);
      CHECK(r->num_splits == 1);
      check_against(r->out, r->lse, ref, c.dtype);
    }
  });
}

TEST_CASE("decode: seqused_k gives each sequence its own length; length 0 gives 0 and -inf") {
  std::vector<int> lengths = {0, 1, 63, 64, 65, 3000};
  std::mt19937 shuffler(4242);
  std::shuffle(lengths.begin(), lengths.end(), shuffler);
  const int empty_sequence =
      static_cast<int>(std::find(lengths.begin(), lengths.end(), 0) - lengths.begin());
  // Decode-shaped, and one prefill-shaped (300 queries: the wgmma family on Hopper).
  std::vector<KvCase> cases = {dense(6, 8, 2, 4, 3072, 128, false),
                               dense(6, 8, 2, 4, 3072, 128, true),
                               dense(6, 8, 2, 4, 3072, 64, true, DType::fp16, /*bhsd=*/true),
                               dense(6, 8, 2, 300, 3072, 128, true)};
  unsigned seed = 7200;
  for (KvCase& c : cases) {
    c.seqused = lengths;
    std::mt19937 rng(seed++);
    const HostKv host = HostKv::random(c, rng);
    const Reference ref = host.reference();
    KvDeviceProblem p(engine(), host);
    for_each_decode_run(
        p, c, std::vector<int>{0, 1, 17},
        [&](const KvRun& run, const ForwardOptions& options, const std::string& what,
            const std::string& variant) {
          const int empty = check_against(run.out, run.lse, ref, c.dtype);
          // The length-0 sequence's rows, plus (causal, bottom-right) the first seqlen_q - L rows
          // of each sequence of L < seqlen_q keys.
          int rows_without_keys = 0;
          for (int length : lengths)
            rows_without_keys += length == 0 ? c.seqlen_q
                                 : c.causal  ? std::max(c.seqlen_q - length, 0)
                                             : 0;
          CHECK(empty == c.heads_q * rows_without_keys);
          check_splits(run, options.num_splits, c);
          check_decode_variant(run, c, options);
          bool zero = true, minus_infinity = true;
          for (int h = 0; h < c.heads_q; ++h)
            for (int i = 0; i < c.seqlen_q; ++i) {
              zero = zero && row_is_zero(run.out, empty_sequence, i, h);
              const float lse =
                  run.lse[static_cast<std::size_t>(lse_index(c, empty_sequence, h, i))];
              minus_infinity = minus_infinity && std::isinf(lse) && lse < 0;
            }
          CHECK_MESSAGE(zero, "a sequence with seqused_k 0 has a row that is not 0");
          CHECK_MESSAGE(minus_infinity, "a sequence with seqused_k 0 has an LSE that is not -inf");
        });
  }
}

TEST_CASE("decode: paged KV caches (NHD and HND, shuffled page tables) match the dense reference") {
  std::vector<KvCase> cases;
  int index = 0;
  for (int page_size : {8, 16, 24, 64, 256})
    for (bool hnd : {false, true})
      for (int group : {4, 8}) {
        KvCase c;
        c.batch = 4, c.heads_kv = 2, c.heads_q = 2 * group, c.seqlen_q = 4, c.causal = true;
        c.page_size = page_size, c.head_major = hnd, c.spare_pages = 5;
        c.capacity = (1100 + page_size - 1) / page_size * page_size;
        c.head_dim = index % 3 == 1 ? 64 : 128;
        c.dtype = index % 4 == 3 ? DType::fp16 : DType::bf16;
        // Full, one key into the second page, fewer keys than queries, and anything.
        c.seqused = {c.capacity, page_size + 1, 3, 1 + (index * 389) % c.capacity};
        ++index;
        cases.push_back(c);
      }
  // 128 query rows per KV head: too many for a dense decode, but decode reads every paged cache.
  cases.push_back(with_pages(dense(2, 16, 2, 16, 512, 128, true), 16, {512, 300}));
  // Speculative decode with GQA: 64 and 48 rows per KV head.
  cases.push_back(with_pages(dense(3, 8, 2, 16, 1504, 128, true), 16, {1504, 17, 5}));
  cases.push_back(with_pages(dense(2, 16, 2, 6, 960, 64, true), 64, {900, 65}, /*hnd=*/true));
  // No seqused_k (every sequence fills its pages), MQA, one query.
  KvCase full = dense(3, 8, 1, 1, 2048, 128, false);
  full.page_size = 64, full.spare_pages = 1;
  cases.push_back(full);
  KvCase d256 = dense(2, 8, 2, 2, 1024, 256, true, DType::fp16, /*bhsd=*/true);
  d256.page_size = 32, d256.seqused = {1000, 33};
  cases.push_back(d256);

  unsigned seed = 7300;
  for (KvCase& c : cases) {
    std::mt19937 rng(seed++);
    std::shuffle(c.seqused.begin(), c.seqused.end(), rng);
    const HostKv host = HostKv::random(c, rng);
    const Reference ref = host.reference();
    KvDeviceProblem p(engine(), host);
    for_each_decode_run(
        p, c, std::vector<int>{0, 5},
        [&](const KvRun& run, const ForwardOptions& options, const std::string& what,
            const std::string& variant) {
          check_against(run.out, run.lse, ref, c.dtype);
          check_splits(run, options.num_splits, c);
          check_decode_variant(run, c, options);
          MESSAGE(fmt::format("{:<45} {:<90} splits {}", variant, what, run.num_splits));
        });
  }
}

TEST_CASE("64-row decode tiles (forced): two row groups, dense and paged caches, split or not") {
  std::vector<KvCase> cases = {
      dense(2, 8, 2, 16, 3000, 128, true),   // 64 rows: both row groups full
      dense(2, 8, 2, 12, 1000, 128, false),  // 48 rows: the second group half full
      dense(1, 16, 2, 6, 2000, 64, true),    // 48 rows at d64 (128-key tiles)
      dense(3, 4, 4, 40, 700, 128, true),    // MHA, 40 rows: the second group a quarter full
      dense(2, 8, 8, 20, 500, 128, true),    // 20 rows: the second group has none
  };
  cases.push_back(with_pages(dense(3, 8, 2, 16, 1504, 128, true), 16, {1504, 17, 5}));
  cases.push_back(with_pages(dense(2, 16, 2, 8, 960, 64, false), 64, {900, 65}, /*hnd=*/true));
  for_each_random_case(cases, 7900, [&](const KvCase& c, KvDeviceProblem& p, const Reference& ref) {
    for (int splits : {1, 3, 0})
      for (const auto& kernel : decode_kernels()) {
        ForwardOptions options;
        options.num_splits = splits;
        options.family = kernel;
        options.tiles = TileConfig{64, c.head_dim == 64 ? 128 : 64, 3};
        const std::string what = describe(c, options);
        CAPTURE(what);
        const auto r = run_kv(p, c, options);
        REQUIRE(r);  // every case here is decode-sized (at most 64 rows) or paged
        CHECK(r->variant.tile_m == 64);
        CHECK(r->variant.family.starts_with("decode"));
        check_against(r->out, r->lse, ref, c.dtype);
        check_splits(*r, splits, c);
        MESSAGE(fmt::format("{:<45} {:<70} splits {}", r->variant.name(), what, r->num_splits));
      }
  });
}

// A chunk of queries against a paged cache (chunked prefill, prefix caching): on Hopper the
// wgmma family reads the pages (the dispatcher's pick, checked): in TMA runs of rows from pages
// of 64, gathered row by row below (8 to 48), forced splits stay with decode_tma, and the
// cp.async decode kernel runs it too; elsewhere decode runs it. The mma family (sm_80+), forced,
// gathers the pages' rows a lookup per row.
TEST_CASE("paged prefill: 333 queries over pages of 8 to 256 rows, NHD and HND, GQA 1:1 to 8:1") {
  std::vector<KvCase> cases;
  int index = 0;
  for (int page_size : {8, 16, 24, 32, 48, 64, 128, 256})
    for (bool hnd : {false, true}) {
      const int group = std::vector<int>{1, 4, 8}[index % 3];
      KvCase c;
      c.batch = 2, c.heads_kv = 2, c.heads_q = 2 * group, c.seqlen_q = 333;
      c.causal = index % 2 == 0;
      c.page_size = page_size, c.head_major = hnd, c.spare_pages = 3;
      c.capacity = (1100 + page_size - 1) / page_size * page_size;
      c.head_dim = std::vector<int>{128, 64, 128, 256}[index % 4];
      c.dtype = index % 5 == 4 ? DType::fp16 : DType::bf16;
      // Every key; a few more keys than queries; fewer (causal: rows that see no key). Without
      // seqused_k every third case: each sequence fills its pages.
      if (index % 3 != 2) c.seqused = {c.capacity - 1 - index, 200 + 37 * index};
      ++index;
      cases.push_back(c);
    }
  for_each_random_case(cases, 7350, [&](const KvCase& c, KvDeviceProblem& p, const Reference& ref) {
    std::vector<std::optional<std::string>> kernels = decode_kernels();
    const bool hopper = engine().device().arch == "sm_90a";
    if (hopper) kernels.push_back("wgmma");
    kernels.push_back("mma");
    int wgmma_runs = 0, mma_runs = 0;
    for_each_decode_run(
        p, c, std::vector<int>{0, 3},
        [&](const KvRun& run, const ForwardOptions& options, const std::string& what,
            const std::string& variant) {
          check_against(run.out, run.lse, ref, c.dtype);
          check_decode_variant(run, c, options);
          wgmma_runs += options.family == "wgmma";
          mma_runs += options.family == "mma";
          MESSAGE(fmt::format("{:<55} {:<90} splits {}", variant, what, run.num_splits));
        },
        kernels);
    // wgmma and mma forced run every case unsplit (and refuse split keys, which they do not
    // have).
    CHECK(wgmma_runs == (hopper ? 1 : 0));
    CHECK(mma_runs == 1);
  });
}

// Head dims the decode and wgmma families have no kernels for (32, 96, 192): a paged cache goes to
// the mma family, which gathers the pages' rows through the page table, decode steps and prefill
// chunks alike (before, no family took them).
TEST_CASE("paged caches at head dims 32, 96 and 192 run in mma: decode steps and prefill chunks") {
  std::vector<KvCase> cases;
  int index = 0;
  for (int head_dim : {32, 96, 192})
    for (int seqlen_q : {3, 200}) {
      KvCase c;
      c.batch = 2, c.heads_kv = 2, c.heads_q = 8, c.seqlen_q = seqlen_q;
      c.causal = index % 2 == 0;
      c.page_size = std::vector<int>{24, 64, 16}[index % 3];
      c.head_major = index % 2 == 1, c.spare_pages = 2;
      c.capacity = (700 + c.page_size - 1) / c.page_size * c.page_size;
      c.head_dim = head_dim;
      c.dtype = index % 3 == 2 ? DType::fp16 : DType::bf16;
      // A sequence shorter than its queries (causal: rows with no key) and one near capacity.
      c.seqused = {c.capacity - 5, 150 + 31 * index};
      ++index;
      cases.push_back(c);
    }
  for_each_random_case(cases, 7450, [&](const KvCase& c, KvDeviceProblem& p, const Reference& ref) {
    const std::string what = describe(c, {});
    CAPTURE(what);
    const auto run = run_kv(p, c, ForwardOptions{});
    REQUIRE(run);
    CHECK(run->variant.family == "mma");
    CHECK(run->variant.paged);
    check_against(run->out, run->lse, ref, c.dtype);
    MESSAGE(fmt::format("{:<55} {}", run->variant.name(), what));
  });
}

TEST_CASE(
    "decode: bad KV caches and split counts are refused, naming the argument; nothing is written") {
  KvCase c = dense(2, 8, 2, 1, 1024, 128, false);
  c.page_size = 16, c.spare_pages = 3, c.seqused = {1024, 517};
  std::mt19937 rng(7400);
  const HostKv host = HostKv::random(c, rng);
  const Reference ref = host.reference();
  KvDeviceProblem p(engine(), host);
  const KVCache good = p.kv();
  ForwardOptions options;
  options.lse = p.lse();
  auto forward = [&](const KVCache& kv, const ForwardOptions& o = {}) {
    return [&p, kv, o] { engine().forward(p.q(), kv, p.out(), o); };
  };
  auto pages = [&](bool hnd, void* data, std::int64_t num_pages, std::int64_t page_size) {
    return hnd ? TensorView::bhsd(data, c.dtype, num_pages, page_size, c.heads_kv, c.head_dim)
               : TensorView::bshd(data, c.dtype, num_pages, page_size, c.heads_kv, c.head_dim);
  };

  KVCache bad = good;
  bad.k = pages(false, good.k.data, c.num_pages(), 12);
  bad.v = pages(false, good.v.data, c.num_pages(), 12);
  check_refused("page_size 12 (NHD)", forward(bad, options), {"page_size"});
  bad.k = pages(true, good.k.data, c.num_pages(), 20);
  bad.v = pages(true, good.v.data, c.num_pages(), 20);
  check_refused("page_size 20 (HND)", forward(bad, options), {"page_size"});

  // Shaped so that, read as a dense cache, it would be valid: it must not be run as one.
  const KVCache no_table =
      KVCache::paged(pages(false, good.k.data, c.batch, c.page_size),
                     pages(false, good.v.data, c.batch, c.page_size), nullptr, 1);
  check_refused("pages_per_seq 1 without a page table", forward(no_table, options),
                {"page_table", "pages_per_seq"});

  bad = good;
  bad.v.shape[0] = c.num_pages() - 1;
  check_refused("v pages fewer than k pages", forward(bad, options), {"v.shape"});
  bad = good;
  bad.v = pages(false, good.v.data, c.num_pages(), 8);
  check_refused("v page_size 8, k page_size 16", forward(bad, options), {"v.shape"});

  for (std::int64_t columns : {0, -1}) {
    bad = good;
    bad.pages_per_seq = bad.page_table_stride = columns;
    check_refused(fmt::format("pages_per_seq {}", columns), forward(bad, options),
                  {"pages_per_seq"});
  }
  bad = good;
  bad.page_table_stride = good.pages_per_seq - 1;
  check_refused("page_table_stride < pages_per_seq", forward(bad, options), {"page_table_stride"});
  // seqused_k is int32: a capacity of 2^31 keys (pages_per_seq x page_size) has no meaning.
  bad = good;
  bad.pages_per_seq = bad.page_table_stride = (std::int64_t{1} << 31) / c.page_size;
  check_refused("capacity 2^31 keys", forward(bad, options), {"pages_per_seq", "page_size"});

  for (int splits : {-1, 129}) {
    ForwardOptions o = options;
    o.num_splits = splits;
    const std::string what = fmt::format("num_splits {}", splits);
    check_refused(what + " (forward)", forward(good, o), {"num_splits"});
    check_refused(what + " (select_variant)",
                  [&] { engine().select_variant(p.q(), good, p.out(), o); }, {"num_splits"});
    check_refused(what + " (select_num_splits)",
                  [&] { engine().select_num_splits(p.q(), good, p.out(), o); }, {"num_splits"});
    check_refused(what + " (workspace_bytes)",
                  [&] { engine().workspace_bytes(p.q(), good, p.out(), o); }, {"num_splits"});
  }

  ForwardOptions split = options;
  split.num_splits = 8;
  const std::size_t need = engine().workspace_bytes(p.q(), good, p.out(), split);
  REQUIRE(need > 0);
  DeviceBuffer workspace(engine(), need + 256);
  split.workspace = static_cast<char*>(workspace.data()) + 16;
  split.workspace_bytes = need;
  check_refused("workspace not 256-byte aligned", forward(good, split), {"workspace"});
  split.workspace = workspace.data();
  split.workspace_bytes = need - 1;
  check_refused("workspace one byte short", forward(good, split), {"workspace"});

  synchronize(engine());
  CHECK_MESSAGE(all_poison(p.output()), "a refused call wrote the output");
  CHECK_MESSAGE(all_poison(p.lse_values()), "a refused call wrote the LSE");

  // The caller's workspace of exactly the size asked for.
  split.workspace_bytes = need;
  if (const auto r = run_kv(p, c, split)) {
    check_against(r->out, r->lse, ref, c.dtype);
    CHECK(r->num_splits == 8);
  }
  // Every split count the header allows, each checked against float64.
  int failed = 0;
  for (int splits = 0; splits <= 128; ++splits) {
    ForwardOptions o;
    o.num_splits = splits;
    const auto r = run_kv(p, c, o);
    if (!r) {
      ++failed;
      continue;
    }
    const std::string what = describe(c, o);
    CAPTURE(what);
    const ForwardErrors errors = compare_forward(r->out, &r->lse, ref);
    const std::string failures = describe_failures(errors, c.dtype);
    if (!failures.empty()) ++failed;
    CHECK_MESSAGE(failures.empty(), failures);
    check_splits(*r, splits, c);
  }
  CHECK(failed == 0);
}

TEST_CASE("merge_attention_states: two halves of the keys merge to attention over all of them") {
  // Causal composes: with the split at most capacity - seqlen_q + 1 keys in, every query row sees
  // all of the first half (run unmasked), and the second half's mask aligned bottom-right to its
  // own length is the whole mask.
  const std::vector<KvCase> cases = {dense(2, 8, 2, 4, 1000, 128, false),
                                     dense(2, 8, 2, 4, 1000, 64, true, DType::fp16, true)};
  constexpr int kSplit = 488;
  unsigned seed = 7500;
  for (const KvCase& c : cases) {
    CAPTURE(c.describe());
    std::mt19937 rng(seed++);
    const HostKv host = HostKv::random(c, rng);
    const Reference ref = host.reference();
    const KvDeviceProblem p(engine(), host);
    const KVCache first = KVCache::dense(key_range(p.k(), 0, kSplit), key_range(p.v(), 0, kSplit));
    const KVCache second = KVCache::dense(key_range(p.k(), kSplit, c.capacity - kSplit),
                                          key_range(p.v(), kSplit, c.capacity - kSplit));
    State a(p, host), b(p, host), merged(p, host);
    auto run_half = [&](const KVCache& kv, const State& into, bool causal) {
      ForwardOptions options;
      options.causal = causal;
      options.lse = into.lse();
      engine().forward(p.q(), kv, into.out(), options);
    };
    run_half(first, a, false);
    run_half(second, b, c.causal);
    engine().merge_attention_states(a.out(), a.lse(), b.out(), b.lse(), merged.out(), merged.lse());
    synchronize(engine());
    const HostTensor out = merged.output();
    const std::vector<float> lse = merged.lse_values();
    check_against(out, lse, ref, c.dtype);

    // In place into out_b, with no LSE out: lse_b stays as it was.
    const std::vector<float> lse_b = b.lse_values();
    engine().merge_attention_states(a.out(), a.lse(), b.out(), b.lse(), b.out());
    synchronize(engine());
    CHECK(b.output().bits == out.bits);
    CHECK(same_bits(b.lse_values(), lse_b));

    // In place into out_a and lse_a (the second half recomputed first).
    run_half(second, b, c.causal);
    engine().merge_attention_states(a.out(), a.lse(), b.out(), b.lse(), a.out(), a.lse());
    synchronize(engine());
    CHECK(a.output().bits == out.bits);
    CHECK(same_bits(a.lse_values(), lse));
  }
}

TEST_CASE("merge_attention_states: a state with no keys (LSE -inf) merges to the other") {
  // Sequence 0 has keys only in the first half, sequence 1 only in the second, sequence 2 none:
  // its merge of two empty states is empty too (0 and -inf, not 0/0).
  const KvCase c = dense(3, 4, 1, 2, 600, 64, false);
  constexpr int kSplit = 256;
  std::mt19937 rng(7600);
  const HostKv host = HostKv::random(c, rng);
  const KvDeviceProblem p(engine(), host);
  const DeviceBuffer used_a = device_copy(engine(), std::vector<std::int32_t>{kSplit, 0, 0});
  const DeviceBuffer used_b =
      device_copy(engine(), std::vector<std::int32_t>{0, c.capacity - kSplit, 0});
  const KVCache first = KVCache::dense(key_range(p.k(), 0, kSplit), key_range(p.v(), 0, kSplit),
                                       static_cast<const std::int32_t*>(used_a.data()));
  const KVCache second = KVCache::dense(key_range(p.k(), kSplit, c.capacity - kSplit),
                                        key_range(p.v(), kSplit, c.capacity - kSplit),
                                        static_cast<const std::int32_t*>(used_b.data()));
  State a(p, host), b(p, host), merged(p, host);
  for (auto [kv, state] : {std::pair{&first, &a}, std::pair{&second, &b}}) {
    ForwardOptions options;
    options.lse = state->lse();
    engine().forward(p.q(), *kv, state->out(), options);
  }
  engine().merge_attention_states(a.out(), a.lse(), b.out(), b.lse(), merged.out(), merged.lse());
  synchronize(engine());

  auto reference_over = [&](const std::vector<std::pair<int, int>>& ranges) {
    std::vector<HostTensor> keys, values;
    for (int s = 0; s < c.batch; ++s) {
      const auto [first_key, count] = ranges[static_cast<std::size_t>(s)];
      keys.push_back(host.gather(host.k, s, first_key, count));
      values.push_back(host.gather(host.v, s, first_key, count));
    }
    return reference_per_sequence(host.q, keys, values, 1.0 / std::sqrt(double(c.head_dim)), false);
  };
  const int rows = c.heads_q * c.seqlen_q;  // per sequence
  const int second_len = c.capacity - kSplit;
  {
    INFO("state a: sequences 1 and 2 have no keys");
    CHECK(check_against(a.output(), a.lse_values(), reference_over({{0, kSplit}, {0, 0}, {0, 0}}),
                        c.dtype) == 2 * rows);
  }
  {
    INFO("state b: sequences 0 and 2 have no keys");
    CHECK(check_against(b.output(), b.lse_values(),
                        reference_over({{0, 0}, {kSplit, second_len}, {0, 0}}),
                        c.dtype) == 2 * rows);
  }
  const Reference ref = reference_over({{0, kSplit}, {kSplit, second_len}, {0, 0}});
  const HostTensor out = merged.output();
  const std::vector<float> lse = merged.lse_values();
  {
    INFO("merged: sequence 2 has no keys on either side");
    CHECK(check_against(out, lse, ref, c.dtype) == rows);
  }
  // In place into out_a and lse_a: the same bits.
  engine().merge_attention_states(a.out(), a.lse(), b.out(), b.lse(), a.out(), a.lse());
  synchronize(engine());
  CHECK(a.output().bits == out.bits);
  CHECK(same_bits(a.lse_values(), lse));
}

TEST_CASE("CUDA graphs: a warm paged decode, captured once, replays on new inputs bit for bit") {
  const KvCase c{3, 16, 2, 1, 4096, 128, true, DType::bf16, 16, false, 9, {4096, 1500, 77}};
  KvCase later = c;
  later.seqused = {100, 4000, 2500};
  std::mt19937 rng(7700);
  const HostKv first = HostKv::random(c, rng);
  const HostKv second = HostKv::random(later, rng);  // other values, lengths and page table
  const Reference ref_first = first.reference(), ref_second = second.reference();

  struct Setup {
    const char* what;
    int num_splits;
    bool own_workspace;
  };
  for (const Setup& setup : {Setup{"the engine's workspace, the heuristic's splits", 0, false},
                             Setup{"the caller's workspace, 7 splits", 7, true}}) {
    CAPTURE(setup.what);
    Stream stream(engine());
    KvDeviceProblem p(engine(), first);
    ForwardOptions options;
    options.causal = c.causal;
    options.lse = p.lse();
    options.num_splits = setup.num_splits;
    const std::size_t need = engine().workspace_bytes(p.q(), p.kv(), p.out(), options);
    std::optional<DeviceBuffer> workspace;
    if (setup.own_workspace) {
      REQUIRE(need > 0);
      workspace.emplace(engine(), need);
      options.workspace = workspace->data();
      options.workspace_bytes = need;
    }
    const Variant variant = engine().select_variant(p.q(), p.kv(), p.out(), options);
    CHECK(variant.family.starts_with("decode"));
    CHECK(variant.paged);
    MESSAGE(fmt::format("{}: {} splits {} workspace {} B", setup.what, variant.name(),
                        engine().select_num_splits(p.q(), p.kv(), p.out(), options), need));
    auto forward = [&] { engine().forward(p.q(), p.kv(), p.out(), options, stream.get()); };
    auto outputs = [&] {
      stream.synchronize();
      return std::pair{p.output(), p.lse_values()};
    };

    // Warm-up: compiles, loads and plans the kernels, and sizes the stream's workspace.
    forward();
    const auto [direct_out, direct_lse] = outputs();
    check_against(direct_out, direct_lse, ref_first, c.dtype);

    p.poison();
    const CudaGraph graph(engine().context(), stream.get(), forward);
    {
      INFO("capturing records the launches without running them");
      const auto [out, lse] = outputs();
      CHECK(all_poison(out));
      CHECK(all_poison(lse));
    }
    graph.launch(stream.get());
    {
      INFO("replay 1: the direct forward's bits");
      const auto [out, lse] = outputs();
      CHECK(out.bits == direct_out.bits);
      CHECK(same_bits(lse, direct_lse));
    }
    // New values, lengths and page table in the same buffers: the replay reads them.
    p.upload(second);
    p.poison();
    graph.launch(stream.get());
    const auto [replayed_out, replayed_lse] = outputs();
    {
      INFO("replay 2 on new inputs: the float64 reference");
      check_against(replayed_out, replayed_lse, ref_second, c.dtype);
    }
    p.poison();
    forward();
    {
      INFO("replay 2: the direct forward's bits on the same inputs");
      const auto [out, lse] = outputs();
      CHECK(replayed_out.bits == out.bits);
      CHECK(same_bits(replayed_lse, lse));
    }
    p.upload(first);
    p.poison();
    graph.launch(stream.get());
    {
      INFO("replay 3, on the first inputs again: the first answer");
      const auto [out, lse] = outputs();
      CHECK(out.bits == direct_out.bits);
      CHECK(same_bits(lse, direct_lse));
    }
  }
}

TEST_CASE(
    "CUDA graphs: two batch sizes captured on one stream both replay after the workspace grew") {
  // What a serving loop does: one graph per batch size, captured one after the other on one
  // stream. The larger one grows the engine's workspace for the stream; the graph captured first
  // must still point at live memory.
  KvCase small = dense(1, 8, 1, 1, 2048, 128, false);
  small.page_size = 16, small.seqused = {2048};
  KvCase large = dense(8, 8, 1, 1, 2048, 128, false);
  large.page_size = 16, large.seqused = {2048, 1000, 1, 77, 2048, 555, 1234, 999};
  std::mt19937 rng(7800);
  const HostKv small_host = HostKv::random(small, rng), large_host = HostKv::random(large, rng);
  Stream stream(engine());
  KvDeviceProblem small_p(engine(), small_host), large_p(engine(), large_host);
  auto options_for = [](KvDeviceProblem& p, int splits) {
    ForwardOptions options;
    options.lse = p.lse();
    options.num_splits = splits;
    return options;
  };
  const ForwardOptions small_options = options_for(small_p, 4);
  const ForwardOptions large_options = options_for(large_p, 64);
  REQUIRE(engine().workspace_bytes(large_p.q(), large_p.kv(), large_p.out(), large_options) >
          engine().workspace_bytes(small_p.q(), small_p.kv(), small_p.out(), small_options));
  auto forward_small = [&] {
    engine().forward(small_p.q(), small_p.kv(), small_p.out(), small_options, stream.get());
  };
  auto forward_large = [&] {
    engine().forward(large_p.q(), large_p.kv(), large_p.out(), large_options, stream.get());
  };
  forward_small();
  stream.synchronize();
  const CudaGraph small_graph(engine().context(), stream.get(), forward_small);
  forward_large();
  stream.synchronize();
  const CudaGraph large_graph(engine().context(), stream.get(), forward_large);
  small_p.poison();
  large_p.poison();
  small_graph.launch(stream.get());
  large_graph.launch(stream.get());
  small_graph.launch(stream.get());
  stream.synchronize();
  {
    INFO("the graph captured first (smaller workspace)");
    check_against(small_p.output(), small_p.lse_values(), small_host.reference(), small.dtype);
  }
  {
    INFO("the graph captured second (the grown workspace)");
    check_against(large_p.output(), large_p.lse_values(), large_host.reference(), large.dtype);
  }
}

// The attention variants beyond soft-capping (test_softcap.cpp) against the float64 reference:
// sliding windows (ForwardOptions::window_left / window_right) with StreamingLLM's sink tokens
// (ForwardOptions::sink_tokens), learnable sinks (ForwardOptions::sink_logits) and ALiBi
// (ForwardOptions::alibi_slopes). Dense problems in every family on this GPU that builds them
// (windows on both sides, one side, with causal, seqlen_q != seqlen_k (bottom-right alignment),
// narrower than a tile and wider than the sequence, rows that the window leaves empty (output 0,
// LSE -inf, or the sink's logit), GQA; sink tokens within a tile, past one and past the keys;
// sinks mild and dominating; ALiBi's slopes gentle and steep); decode steps over dense and paged
// caches (NHD and HND, shuffled page tables, seqused_k) under forced and heuristic splits (a sink
// must count once over all splits); prefill over paged caches (wgmma on Hopper, and decode);
// variable-length batches.
#include <doctest/doctest.h>
#include <fmt/format.h>

#include <cmath>
#include <optional>
#include <random>
#include <string>
#include <vector>

#include "flashjit/device_memory.hpp"
#include "forward_case.hpp"
#include "gpu.hpp"
#include "kv_problem.hpp"
#include "serving_checks.hpp"
#include "varlen_problem.hpp"

using namespace flashjit;
using namespace flashjit::test;

namespace {

std::vector<ForwardCase> window_cases() {
  std::vector<ForwardCase> cases;
  for (int d : {64, 128, 256}) {
    ForwardCase both{2, 4, 2, 300, 300, d, false};
    both.window_left = 100, both.window_right = 20;
    cases.push_back(both);
    ForwardCase local{1, 4, 4, 500, 500, d, true};  // Mistral-style: causal, 128 keys back
    local.window_left = 128;
    cases.push_back(local);
  }
  ForwardCase narrow{1, 2, 2, 257, 257, 128, false};  // narrower than a key tile
  narrow.window_left = 3, narrow.window_right = 5;
  cases.push_back(narrow);
  ForwardCase right_only{1, 2, 2, 200, 333, 128, false};  // seqlen_q < seqlen_k: bottom-right
  right_only.window_right = 10;
  cases.push_back(right_only);
  ForwardCase wide{2, 8, 2, 150, 150, 64, true};  // wider than the sequence: plain causal
  wide.window_left = 1000;
  cases.push_back(wide);
  // seqlen_q > seqlen_k: the first rows' windows end before key 0, so they see nothing.
  ForwardCase empty_rows{1, 2, 2, 300, 100, 128, false};
  empty_rows.window_left = 10, empty_rows.window_right = 0;
  cases.push_back(empty_rows);
  return cases;
}

}  // namespace

TEST_CASE("a sliding window matches the float64 reference for every family that builds it") {
  const int ran_somewhere = check_variant_against_plain(
      window_cases(), ".window",
      [](ForwardCase c) {
        c.window_left = c.window_right = -1;
        return c;
      },
      4242);
  CHECK(ran_somewhere > 0);  // some family on this GPU builds window kernels
}

TEST_CASE("sink tokens beside a window match the float64 reference for every family with windows") {
  std::vector<ForwardCase> cases;
  for (int d : {64, 128, 256}) {  // StreamingLLM: causal, 64 keys back, 4 sink tokens
    ForwardCase streaming{1, 4, 4, 500, 500, d, true};
    streaming.window_left = 64, streaming.window_right = 0, streaming.sink_tokens = 4;
    cases.push_back(streaming);
  }
  ForwardCase both{2, 4, 2, 300, 300, 128, false};  // both sides, GQA
  both.window_left = 100, both.window_right = 20, both.sink_tokens = 4;
  cases.push_back(both);
  ForwardCase longer_k{1, 4, 4, 200, 600, 128, true};  // seqlen_q < seqlen_k: bottom-right
  longer_k.window_left = 64, longer_k.sink_tokens = 4;
  cases.push_back(longer_k);
  ForwardCase past_tile{1, 4, 2, 700, 700, 128, true};  // 200 sink tokens: several key tiles
  past_tile.window_left = 64, past_tile.sink_tokens = 200;
  cases.push_back(past_tile);
  ForwardCase all_keys{1, 2, 2, 300, 250, 64, true};  // sink_tokens >= seqlen_k: plain causal
  all_keys.window_left = 32, all_keys.sink_tokens = 300;
  cases.push_back(all_keys);
  // seqlen_q > seqlen_k: the first rows' right sides end before key 0, sinks or not.
  ForwardCase empty_rows{1, 2, 2, 300, 100, 128, false};
  empty_rows.window_left = 10, empty_rows.window_right = 0, empty_rows.sink_tokens = 4;
  cases.push_back(empty_rows);
  const int ran_somewhere = check_variant_against_plain(
      cases, ".window",
      [](ForwardCase c) {
        c.window_left = c.window_right = -1;
        c.sink_tokens = 0;
        return c;
      },
      4343);
  CHECK(ran_somewhere > 0);
}

namespace {

// One logit per query head: around the scores' scale, one far above them (the sink takes nearly
// all of the row: the output shrinks toward 0), one far below (no effect) and a negative one.
std::vector<float> sinks_for(int heads) {
  const float pattern[] = {0.5f, 12.f, -30.f, -1.25f, 2.f, 0.f};
  std::vector<float> sinks;
  for (int h = 0; h < heads; ++h) sinks.push_back(pattern[h % 6]);
  return sinks;
}

}  // namespace

TEST_CASE("learnable sinks match the float64 reference for every family that builds them") {
  std::vector<ForwardCase> cases;
  for (int d : {64, 128, 256})
    for (bool causal : {false, true}) {
      ForwardCase c{2, 6, 2, 200, 333, d, causal};
      c.sink_logits = sinks_for(c.heads_q);
      cases.push_back(c);
    }
  ForwardCase empty_rows{1, 6, 6, 300, 100, 128, true};  // rows 0..199 see no key: LSE = sink
  empty_rows.sink_logits = sinks_for(empty_rows.heads_q);
  cases.push_back(empty_rows);
  ForwardCase gpt_oss{1, 8, 2, 500, 500, 64, true};  // gpt-oss: sinks with a 128-key window
  gpt_oss.sink_logits = sinks_for(gpt_oss.heads_q);
  gpt_oss.window_left = 128;
  cases.push_back(gpt_oss);
  ForwardCase decode{4, 32, 8, 1, 2000, 128, false};  // split-KV decode
  decode.sink_logits = sinks_for(decode.heads_q);
  cases.push_back(decode);
  const int ran_somewhere = check_variant_against_plain(
      cases, ".sink",
      [](ForwardCase c) {
        c.sink_logits.clear();
        return c;
      },
      5150);
  CHECK(ran_somewhere > 0);
}

namespace {

// FlashAttention's (and BLOOM's) ALiBi slopes for `heads` heads: 2^(-8 (h + 1) / heads).
std::vector<float> slopes_for(int heads) {
  std::vector<float> slopes;
  for (int h = 0; h < heads; ++h)
    slopes.push_back(std::exp2(-8.f * static_cast<float>(h + 1) / static_cast<float>(heads)));
  return slopes;
}

}  // namespace

TEST_CASE("ALiBi matches the float64 reference for every family that builds it") {
  std::vector<ForwardCase> cases;
  for (int d : {64, 128, 256})
    for (bool causal : {false, true}) {  // GQA 3:1, seqlen_q != seqlen_k: bottom-right distances
      ForwardCase c{2, 6, 2, 200, 333, d, causal};
      c.alibi_slopes = slopes_for(c.heads_q);
      cases.push_back(c);
    }
  for (int d : {64, 128}) {  // fp16: the slope's 16-bit parts in the Q·Kᵀ slice are halves
    ForwardCase half{1, 4, 2, 256, 300, d, true};
    half.dtype = DType::fp16;
    half.alibi_slopes = slopes_for(half.heads_q);
    cases.push_back(half);
  }
  ForwardCase square{1, 8, 8, 256, 256, 128, true};
  square.alibi_slopes = slopes_for(square.heads_q);
  cases.push_back(square);
  // A slope of 1 per key of distance: keys 30 away weigh e^-30, so each row sees its neighbours.
  ForwardCase steep{1, 4, 2, 400, 400, 128, false};
  steep.alibi_slopes.assign(4, 1.f);
  cases.push_back(steep);
  ForwardCase steep_causal{1, 4, 4, 300, 500, 64, true};
  steep_causal.alibi_slopes = {1.f, 0.5f, 2.f, 0.01f};
  cases.push_back(steep_causal);
  ForwardCase empty_rows{1, 4, 4, 300, 100, 128, true};  // rows 0..199 see no key: 0, LSE -inf
  empty_rows.alibi_slopes = slopes_for(empty_rows.heads_q);
  cases.push_back(empty_rows);
  ForwardCase decode{4, 32, 8, 1, 2000, 128, false};  // split-KV decode
  decode.alibi_slopes = slopes_for(decode.heads_q);
  cases.push_back(decode);
  // Everything at once: causal, soft-capped, a window with sink tokens, sinks, ALiBi.
  ForwardCase stacked{1, 8, 2, 500, 500, 64, true};
  stacked.softcap = 30.f, stacked.input_scale = 2.0;
  stacked.window_left = 128, stacked.sink_tokens = 4;
  stacked.sink_logits = sinks_for(stacked.heads_q);
  stacked.alibi_slopes = slopes_for(stacked.heads_q);
  cases.push_back(stacked);
  const int ran_somewhere = check_variant_against_plain(
      cases, ".alibi",
      [](ForwardCase c) {
        c.alibi_slopes.clear();
        return c;
      },
      6160);
  CHECK(ran_somewhere > 0);
}

namespace {

// What a serving case adds to attention: a window (-1, -1: none) with its sink tokens, sinks
// (sinks_for) and/or ALiBi (slopes_for).
struct Window {
  int left = -1, right = -1;
  bool sink = false;
  int sink_tokens = 0;
  bool alibi = false;

  bool windowed() const { return left >= 0 || right >= 0; }
  std::string describe() const {
    return fmt::format("window ({}, {}){}{}{}", left, right,
                       sink_tokens > 0 ? fmt::format(" sink tokens {}", sink_tokens) : "",
                       sink ? " sinks" : "", alibi ? " alibi" : "");
  }
};

// A case's per-head inputs on the device: sinks_for and slopes_for of its query heads.
struct HeadBuffers {
  DeviceBuffer sinks, slopes;
  explicit HeadBuffers(int heads_q)
      : sinks(device_copy(shared_engine(), sinks_for(heads_q))),
        slopes(device_copy(shared_engine(), slopes_for(heads_q))) {}
};

// The variant's options, the per-head inputs it asks for taken from `heads`.
ForwardOptions window_options(const Window& w, bool causal, float* lse, const HeadBuffers& heads) {
  ForwardOptions options;
  options.window_left = w.left, options.window_right = w.right;
  options.sink_tokens = w.sink_tokens;
  options.causal = causal;
  options.lse = lse;
  if (w.sink) options.sink_logits = static_cast<const float*>(heads.sinks.data());
  if (w.alibi) options.alibi_slopes = static_cast<const float*>(heads.slopes.data());
  return options;
}

ScoreMods window_mods(const Window& w, int heads_q) {
  ScoreMods mods;
  mods.window_left = w.left, mods.window_right = w.right;
  mods.sink_tokens = w.sink_tokens;
  if (w.sink) {
    const std::vector<float> sinks = sinks_for(heads_q);
    mods.sink_logits.assign(sinks.begin(), sinks.end());
  }
  if (w.alibi) {
    const std::vector<float> slopes = slopes_for(heads_q);
    mods.alibi_slopes.assign(slopes.begin(), slopes.end());
  }
  return mods;
}

// Runs `forward` (the variant `w` asks for expected) and checks the output with `check`;
// anything thrown fails.
template <typename Forward, typename Check>
void run_windowed(const std::string& what, const Window& w, Forward&& forward, Check&& check) {
  CAPTURE(what);
  try {
    const Variant variant = forward();
    const std::string name = variant.name();
    CAPTURE(name);
    CHECK(variant.window == w.windowed());
    CHECK(variant.sink == w.sink);
    CHECK(variant.alibi == w.alibi);
    check();
    MESSAGE(fmt::format("{:<50} {}", name, what));
  } catch (const Error& e) {
    FAIL_CHECK(fmt::format("{}: {}", what, e.what()));
  }
}

// "<problem> | <window> | family <kernel>", what a run_windowed call is captured as.
std::string run_label(const std::string& problem, const Window& w,
                      const std::optional<std::string>& kernel) {
  return fmt::format("{} | {} | family {}", problem, w.describe(), kernel.value_or("(dispatcher)"));
}

// The decode family takes prefill-sized paged and varlen problems only split (unsplit they are
// mma's, which reads each K/V tile once: decode_unsupported), so the tests that force it split.
constexpr int kSplitPrefill = 2;

// Poisons p's output and LSE, runs the forward over its KVCache and returns the variant that ran.
Variant forward_over_cache(KvDeviceProblem& p, const ForwardOptions& options) {
  p.poison();
  const KVCache kv = p.kv();
  const Variant v = shared_engine().select_variant(p.q(), kv, p.out(), options);
  shared_engine().forward(p.q(), kv, p.out(), options);
  synchronize(shared_engine());
  return v;
}

}  // namespace

TEST_CASE("windows, sink tokens, sinks and ALiBi in decode steps: dense and paged caches, "
          "seqused_k, every split count") {
  struct Case {
    KvCase kv;
    Window window;
  };
  auto kv_case = [](int b, int hq, int hkv, int sq, int sk, int d, bool causal) {
    KvCase c;
    c.batch = b, c.heads_q = hq, c.heads_kv = hkv, c.seqlen_q = sq, c.capacity = sk;
    c.head_dim = d, c.causal = causal;
    return c;
  };
  std::vector<Case> cases = {
      {kv_case(4, 32, 8, 1, 3000, 128, true), {500, 0}},   // a Mistral-style decode step
      // The same shape, a narrower band but 1000 sink tokens: more tiles to split than above
      // (a plan kept from it would leave some unvisited).
      {kv_case(4, 32, 8, 1, 3000, 128, true), {64, 0, false, 1000}},
      {kv_case(4, 32, 8, 1, 3000, 128, true), {64, 0, false, 4}},  // StreamingLLM
      {kv_case(2, 8, 2, 4, 2000, 64, true), {100, -1, false, 200}},  // sinks past a tile
      {kv_case(1, 4, 4, 1, 700, 128, true), {3, 0, false, 700}},     // sinks: every key
      {kv_case(2, 8, 1, 2, 1500, 256, false), {200, 50, false, 5}},  // both sides, MQA
      {kv_case(4, 32, 8, 1, 3000, 128, true), {-1, -1, false, 0, true}},  // ALiBi, split or not
      {kv_case(2, 8, 2, 4, 2000, 64, true), {-1, -1, false, 0, true}},    // speculative
      {kv_case(2, 8, 1, 2, 1500, 256, false), {-1, -1, false, 0, true}},  // non-causal, MQA
      {kv_case(2, 32, 4, 2, 2500, 128, true), {128, 0, true, 4, true}},   // all of them
      {kv_case(2, 8, 2, 4, 2000, 64, true), {100, -1}},    // speculative: 4 tokens, 4:1
      {kv_case(2, 8, 1, 2, 1500, 256, false), {200, 50}},  // both sides, MQA
      {kv_case(1, 8, 2, 16, 1000, 128, true), {40, 0}},    // 64 rows whose bands differ
      {kv_case(1, 4, 4, 1, 700, 128, true), {3, 0}},       // narrower than a key tile
      {kv_case(1, 4, 1, 1, 5000, 128, false), {-1, 2}},    // a right side alone, non-causal
      {kv_case(4, 32, 8, 1, 3000, 128, true), {-1, -1, true}},  // sinks alone, split or not
      {kv_case(2, 16, 2, 8, 1000, 64, true), {-1, -1, true}},
      {kv_case(2, 32, 4, 2, 2500, 128, true), {128, 0, true}},  // gpt-oss: sinks and a window
  };
  KvCase ragged = kv_case(4, 16, 2, 2, 3000, 128, true);
  ragged.seqused = {3000, 17, 0, 600};
  cases.push_back({ragged, {256, 0}});
  // ALiBi's distances and the sink tokens count from each sequence's own keys.
  cases.push_back({ragged, {-1, -1, false, 0, true}});
  cases.push_back({ragged, {64, 0, false, 20}});
  for (int page_size : {16, 64, 256})
    for (bool hnd : {false, true}) {
      KvCase paged = kv_case(3, 16, 2, 1 + page_size % 3, 0, 128, true);
      paged.page_size = page_size, paged.head_major = hnd, paged.spare_pages = 2;
      paged.capacity = (2500 + page_size - 1) / page_size * page_size;
      paged.seqused = {paged.capacity, 300, 1 + page_size * 7};
      cases.push_back({paged, {page_size * 3 + 5, 0, page_size == 64}});
      // Sink tokens within the first page and past it; ALiBi over the pages.
      cases.push_back({paged, {page_size * 3 + 5, 0, false, page_size == 16 ? 40 : 4}});
      cases.push_back({paged, {-1, -1, false, 0, true}});
    }
  unsigned seed = 9100;
  for (Case& w : cases) {
    std::mt19937 rng(seed++);
    const HostKv host = HostKv::random(w.kv, rng);
    const Reference ref = host.reference({}, window_mods(w.window, w.kv.heads_q));
    KvDeviceProblem p(shared_engine(), host);
    const HeadBuffers heads(w.kv.heads_q);
    if (!decode_has_head_dim(w.kv.head_dim)) continue;
    for (int splits : {0, 1, 3, 17})
      for (const auto& kernel : decode_kernels()) {
        ForwardOptions options = window_options(w.window, w.kv.causal, p.lse(), heads);
        options.num_splits = splits;
        options.family = kernel;
        run_windowed(
            fmt::format("{} | {} | family {} splits {}", w.kv.describe(), w.window.describe(),
                        kernel.value_or("(dispatcher)"), splits),
            w.window,
            [&] {
              const Variant v = forward_over_cache(p, options);
              CHECK(v.family.starts_with("decode"));
              return v;
            },
            [&] { check_against(p.output(), p.lse_values(), ref, w.kv.dtype); });
      }
  }
}

TEST_CASE("windows, sink tokens, sinks and ALiBi in paged prefill: wgmma on Hopper, and decode") {
  unsigned seed = 9150;
  for (int page_size : {16, 64})
    for (const Window& window : {Window{100, 0}, Window{100, 0, false, 20}, Window{-1, -1, true},
                                 Window{-1, -1, false, 0, true}, Window{64, 0, true, 4, true}}) {
      // 200 queries x 4 query heads per KV head: prefill-sized, so wgmma's on Hopper.
      KvCase c;
      c.batch = 2, c.heads_q = 8, c.heads_kv = 2, c.seqlen_q = 200, c.head_dim = 128;
      c.causal = true, c.page_size = page_size, c.head_major = page_size == 64;
      c.spare_pages = 2, c.capacity = (1500 + page_size - 1) / page_size * page_size;
      c.seqused = {c.capacity, 300};
      std::mt19937 rng(seed++);
      const HostKv host = HostKv::random(c, rng);
      const Reference ref = host.reference({}, window_mods(window, c.heads_q));
      KvDeviceProblem p(shared_engine(), host);
      const HeadBuffers heads(c.heads_q);
      for (const auto& kernel : decode_kernels()) {
        ForwardOptions options = window_options(window, c.causal, p.lse(), heads);
        options.family = kernel;
        options.num_splits = kernel ? kSplitPrefill : 0;
        run_windowed(
            run_label(c.describe(), window, kernel), window,
            [&] {
              const Variant v = forward_over_cache(p, options);
              const bool hopper = shared_engine().device().arch == "sm_90a";
              CHECK(v.family == (hopper && !kernel ? "wgmma" : "decode"));
              CHECK(v.paged);
              return v;
            },
            [&] { check_against(p.output(), p.lse_values(), ref, c.dtype); });
      }
    }
}

TEST_CASE("windows, sink tokens, sinks and ALiBi in variable-length batches: prefill and decode "
          "kernels, GQA 4:1") {
  unsigned seed = 9200;
  for (bool causal : {false, true})
    for (const Window& window :
         {Window{50, causal ? 0 : 20}, Window{1, causal ? -1 : 0}, Window{-1, -1, true},
          Window{30, 0, true}, Window{50, causal ? 0 : 20, false, 4}, Window{20, 0, false, 100},
          Window{-1, -1, false, 0, true}, Window{30, 0, true, 4, true}}) {
      VarlenCase c;
      c.heads_q = 8, c.heads_kv = 2, c.head_dim = 128, c.dtype = DType::bf16, c.causal = causal;
      c.seqlens_q = {1, 200, 0, 65, 63, 300};
      c.seqlens_k = {5, 777, 64, 0, 64, 300};
      std::mt19937 rng(seed++);
      const HostVarlen host = HostVarlen::random(c, rng);
      const std::vector<Reference> refs = host.reference({}, window_mods(window, c.heads_q));
      VarlenDeviceProblem p(shared_engine(), host);
      const HeadBuffers heads(c.heads_q);
      // The dispatcher's kernel (wgmma on Hopper) and the decode family's.
      for (const auto& kernel : decode_kernels()) {
        ForwardOptions options = window_options(window, causal, p.lse(), heads);
        options.family = kernel;
        options.num_splits = kernel ? kSplitPrefill : 0;
        run_windowed(
            run_label(c.describe(), window, kernel), window,
            [&] {
              p.poison();
              const KVCache kv = p.kv();
              const Variant v =
                  shared_engine().select_variant(p.q(), kv, p.out(), p.varlen(), options);
              shared_engine().forward(p.q(), kv, p.out(), p.varlen(), options);
              synchronize(shared_engine());
              return v;
            },
            [&] { check_varlen_against(host, refs, p.output(), p.lse_values()); });
      }
    }
}

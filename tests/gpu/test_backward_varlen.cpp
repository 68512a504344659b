// Engine::backward over variable-length batches (VarlenBatch, a dense packed k and v) on the GPU,
// for every dK/dV family here: each sequence's gradients against the float64 reference of that
// sequence alone, sequences of 0 to a few hundred tokens (and more keys than queries, or fewer)
// mixed, GQA, causal and not, the score variants, the deterministic mode, and rows after the last
// sequence left unwritten. Gradients hold NaN before every run, so an element a kernel skips shows.
#include <doctest/doctest.h>
#include <fmt/format.h>

#include <algorithm>
#include <array>
#include <cmath>
#include <numeric>
#include <optional>
#include <random>
#include <string>
#include <vector>

#include "compare_backward.hpp"
#include "flashjit/device_memory.hpp"
#include "gpu.hpp"
#include "poisoned_output.hpp"
#include "reference_backward.hpp"
#include "user_examples.hpp"
#include "varlen_problem.hpp"

using namespace flashjit;
using namespace flashjit::test;

namespace {

Engine& engine() { return shared_engine(); }

// The forward's score variants and the backward's mode, on top of a VarlenCase.
struct VarlenBackwardCase {
  VarlenCase shape;
  float softcap = 0.f;
  int window_left = -1, window_right = -1, sink_tokens = 0;
  bool alibi = false, sinks = false;
  bool deterministic = false;
  // User functions given to both passes, and their host mirrors (batch: the sequence).
  const UserFunctions* user_functions = nullptr;
  std::array<const void*, kMaxUserArgs> user_args{};
  HostScoreMod score_mod, score_mod_grad;
  HostMaskMod mask_mod;

  std::string describe() const {
    return fmt::format(
        "{}{}{}{}{}{}{}", shape.describe(),
        softcap > 0.f ? fmt::format(" softcap {}", softcap) : "",
        window_left >= 0 || window_right >= 0
            ? fmt::format(" window ({}, {}) sink tokens {}", window_left, window_right, sink_tokens)
            : "",
        alibi ? " alibi" : "", sinks ? " sinks" : "", deterministic ? " deterministic" : "",
        user_functions ? " user" + user_functions->hash().substr(0, 8) : "");
  }
  ScoreMods mods() const {
    ScoreMods mods;
    mods.softcap = softcap;
    mods.window_left = window_left;
    mods.window_right = window_right;
    mods.sink_tokens = sink_tokens;
    for (int h = 0; h < shape.heads_q; ++h) {
      // Values exact in fp32, so the GPU and the reference use the same numbers.
      if (alibi) mods.alibi_slopes.push_back(std::exp2(-8.0 * (h + 1) / shape.heads_q));
      if (sinks) mods.sink_logits.push_back(0.75 - 0.5 * (h % 4));
    }
    mods.score_mod = score_mod;
    mods.score_mod_grad = score_mod_grad;
    mods.mask_mod = mask_mod;
    return mods;
  }
  template <typename Options>
  void set_variants(Options& options, const float* alibi_slopes, const float* sink_logits) const {
    options.causal = shape.causal;
    options.softcap = softcap;
    options.window_left = window_left;
    options.window_right = window_right;
    options.sink_tokens = sink_tokens;
    options.alibi_slopes = alibi_slopes;
    options.sink_logits = sink_logits;
    options.user_functions = user_functions;
    options.user_args = user_args;
  }
};

std::optional<DeviceBuffer> per_head(const std::vector<double>& values) {
  if (values.empty()) return std::nullopt;
  const std::vector<float> floats(values.begin(), values.end());
  DeviceBuffer buffer(engine(), floats.size() * sizeof(float));
  buffer.upload(floats.data(), floats.size() * sizeof(float));
  return buffer;
}

const float* floats(const std::optional<DeviceBuffer>& buffer) {
  return buffer ? static_cast<const float*>(buffer->data()) : nullptr;
}

bool all_zero(const HostTensor& t) {
  return std::all_of(t.bits.begin(), t.bits.end(),
                     [](std::uint16_t b) { return (b & 0x7fff) == 0; });
}

// Rows after the last sequence's: the backward never writes them. The random inputs hold NaN
// there; the backward reads whole tiles, so they must be finite (Engine::backward's contract).
void make_tail_finite(HostVarlen& host) {
  const int owned = host.cu_seqlens_q.back();
  for (std::int64_t r = owned; r < host.q.view.shape[1]; ++r)
    for (std::int64_t h = 0; h < host.shape.heads_q; ++h)
      for (std::int64_t d = 0; d < host.shape.head_dim; ++d)
        host.q.bits[static_cast<std::size_t>(host.q.offset(0, r, h, d))] =
            from_float(host.shape.dtype, 0.25f);
}

// One case: forward (with LSE) then backward in `family`, on fresh random inputs.
class VarlenBackwardProblem {
 public:
  VarlenBackwardProblem(const VarlenBackwardCase& c, unsigned seed)
      : case_(c),
        rng_(seed),
        host_(make_host(c.shape, rng_)),
        device_(engine(), host_),
        dout_(host_.q),
        dout_device_(engine(), host_.q.bytes()),
        dq_(engine(), host_.q.view, host_.q.bits.size(), 0),
        dk_(engine(), host_.k.view, host_.k.bits.size(), 0),
        dv_(engine(), host_.v.view, host_.v.bits.size(), 0) {
    dout_.fill_random(rng_);
    dout_device_.upload(dout_.bits.data(), dout_.bytes());
    const ScoreMods mods = c.mods();
    alibi_ = per_head(mods.alibi_slopes);
    sinks_ = per_head(mods.sink_logits);
    if (c.sinks) dsink_.emplace(engine(), static_cast<std::size_t>(c.shape.heads_q) * 4);
    ForwardOptions forward;
    c.set_variants(forward, floats(alibi_), floats(sinks_));
    forward.lse = device_.lse();
    engine().forward(device_.q(), device_.kv(), device_.out(), device_.varlen(), forward);
    synchronize(engine());
  }

  BackwardOptions options(const std::string& family) const {
    BackwardOptions options;
    case_.set_variants(options, floats(alibi_), floats(sinks_));
    options.deterministic = case_.deterministic;
    options.family = family;
    options.d_sink_logits = dsink_ ? static_cast<float*>(dsink_->data()) : nullptr;
    return options;
  }
  std::string variant(const BackwardOptions& options) const {
    return engine()
        .select_backward_variant(device_.q(), device_.k(), device_.v(), device_.varlen(), options)
        .name();
  }
  void backward(const BackwardOptions& options) {
    dq_.poison();
    dk_.poison();
    dv_.poison();
    if (dsink_) dsink_->fill_bytes(0xff);
    TensorView dout = dout_.view;
    dout.data = dout_device_.data();
    engine().backward(device_.q(), device_.k(), device_.v(), device_.out(), dout, device_.lse(),
                      dq_.out(), dk_.out(), dv_.out(), device_.varlen(), options);
    synchronize(engine());
  }

  struct Gradients {
    HostTensor dq, dk, dv;
    std::vector<float> dsink;
  };
  Gradients gradients() const {
    Gradients g{dq_.output(), dk_.output(), dv_.output(), {}};
    if (dsink_) {
      g.dsink.resize(static_cast<std::size_t>(case_.shape.heads_q));
      dsink_->download(g.dsink.data(), g.dsink.size() * sizeof(float));
    }
    return g;
  }

  // Each sequence's gradients against its own float64 reference; the sinks' gradient summed
  // over the sequences; rows past the last sequence still poisoned.
  void check(const Gradients& g) const {
    const VarlenCase& s = case_.shape;
    const double scale = 1.0 / std::sqrt(static_cast<double>(s.head_dim));
    ScoreMods mods = case_.mods();
    std::vector<double> dsink(mods.sink_logits.size(), 0.0);
    for (int b = 0; b < s.batch(); ++b) {
      CAPTURE(b);
      mods.first_batch = b;  // what the user functions see as the batch
      const HostTensor dq = host_.sequence_rows(g.dq, b);
      const HostTensor dk = host_.sequence_keys(g.dk, b), dv = host_.sequence_keys(g.dv, b);
      CAPTURE(s.seqlens_q[b]);
      CAPTURE(s.seqlens_k[b]);
      if (s.seqlens_q[b] == 0 || s.seqlens_k[b] == 0) {
        // No row or no key: nothing to compare with, every gradient of it exactly zero.
        CHECK_MESSAGE(all_zero(dq), "dq of a sequence without keys is not zero");
        CHECK_MESSAGE(all_zero(dk), "dk of a sequence without queries or keys is not zero");
        CHECK_MESSAGE(all_zero(dv), "dv of a sequence without queries or keys is not zero");
        continue;  // nor does it add to dsink: its rows have O = 0, so delta 0
      }
      const ReferenceGradients want = reference_attention_backward(
          host_.sequence_rows(host_.q, b), host_.sequence_keys(host_.k, b),
          host_.sequence_keys(host_.v, b), host_.sequence_rows(dout_, b), scale, s.causal, mods);
      const GradientErrors errors = compare_backward(dq, dk, dv, want);
      const std::string failures = describe_failures(errors, s.dtype);
      CHECK_MESSAGE(failures.empty(), failures);
      for (std::size_t h = 0; h < dsink.size(); ++h) dsink[h] += want.dsink[h];
    }
    if (!dsink.empty()) {
      double top = 1;
      for (double x : dsink) top = std::max(top, std::abs(x));
      for (std::size_t h = 0; h < dsink.size(); ++h) {
        CAPTURE(h);
        CHECK(std::abs(g.dsink[h] - dsink[h]) / top <= gradient_tolerance(s.dtype));
      }
    }
    const int owned = host_.cu_seqlens_q.back();
    for (std::int64_t r = owned; r < g.dq.view.shape[1]; ++r)
      for (std::int64_t h = 0; h < s.heads_q; ++h)
        CHECK_MESSAGE(g.dq.bits[static_cast<std::size_t>(g.dq.offset(0, r, h, 0))] == 0xffff,
                      fmt::format("dq row {} (after the last sequence) was written", r));
  }

 private:
  static HostVarlen make_host(const VarlenCase& shape, std::mt19937& rng) {
    HostVarlen host = HostVarlen::random(shape, rng);
    make_tail_finite(host);
    return host;
  }

  VarlenBackwardCase case_;
  std::mt19937 rng_;
  HostVarlen host_;
  VarlenDeviceProblem device_;
  HostTensor dout_;
  DeviceBuffer dout_device_;
  PoisonedOutput dq_, dk_, dv_;
  std::optional<DeviceBuffer> alibi_, sinks_, dsink_;
};

// The case in every dK/dV family here that builds its head dim (the deterministic mode refuses
// bwd_wgmma_fused): the family's varlen variant, each sequence within the bounds.
void check_in_every_family(const VarlenBackwardCase& c, unsigned seed) {
  VarlenBackwardProblem problem(c, seed);
  const std::vector<std::string> names = backward_family_names();
  REQUIRE_MESSAGE(!names.empty(), "no backward dK/dV family runs here");
  for (const std::string& family : names) {
    if (!family_has_head_dim(family, c.shape.head_dim)) continue;
    if (c.deterministic && family == "bwd_wgmma_fused") continue;
    CAPTURE(family);
    CAPTURE(c.describe());
    const BackwardOptions options = problem.options(family);
    const std::string variant = problem.variant(options);
    CAPTURE(variant);
    CHECK(variant.starts_with(family + "."));
    CHECK(variant.find(".varlen") != std::string::npos);
    problem.backward(options);
    const VarlenBackwardProblem::Gradients g = problem.gradients();
    problem.check(g);
    if (c.deterministic) {  // a second run, bit for bit
      problem.backward(options);
      const VarlenBackwardProblem::Gradients again = problem.gradients();
      CHECK_MESSAGE(again.dq.bits == g.dq.bits, "dq differs bitwise");
      CHECK_MESSAGE(again.dk.bits == g.dk.bits, "dk differs bitwise");
      CHECK_MESSAGE(again.dv.bits == g.dv.bits, "dv differs bitwise");
    }
    MESSAGE(fmt::format("{:<52} {}", variant, c.describe()));
  }
}

// Lengths from `q` and `k`, the same permutation for both.
VarlenCase ragged(std::vector<int> q, std::vector<int> k, int heads_q, int heads_kv, int head_dim,
                  bool causal, unsigned seed) {
  std::mt19937 rng(seed);
  std::vector<std::size_t> order(q.size());
  std::iota(order.begin(), order.end(), 0);
  std::shuffle(order.begin(), order.end(), rng);
  VarlenCase c;
  c.heads_q = heads_q, c.heads_kv = heads_kv, c.head_dim = head_dim, c.causal = causal;
  for (std::size_t i : order) {
    c.seqlens_q.push_back(q[i]);
    c.seqlens_k.push_back(k[i]);
  }
  c.tail_rows = 5;
  return c;
}

}  // namespace

TEST_CASE("varlen backward: sequences of 0 to 300 tokens, every head dim, causal or not, GQA 4:1") {
  unsigned seed = 9100;
  // The head dims with a varlen forward everywhere, which makes these cases' outputs and LSE;
  // the backward's others (32, 96, 192) run in flashjit_every_variant (tools/sanitize.sh), which
  // makes them by a forward per sequence.
  for (int head_dim : {64, 128, 256})
    for (bool causal : {false, true}) {
      VarlenBackwardCase c;
      c.shape = ragged({0, 1, 63, 65, 200, 130, 7, 128}, {5, 0, 63, 129, 200, 300, 7, 128}, 8, 2,
                       head_dim, causal, seed);
      check_in_every_family(c, seed++);
    }
}

TEST_CASE("varlen backward: fp16, MQA, more queries than keys, one sequence, many sequences") {
  VarlenBackwardCase fp16;
  fp16.shape = ragged({300, 17, 64}, {100, 40, 64}, 4, 1, 128, true, 9200);
  fp16.shape.dtype = DType::fp16;
  check_in_every_family(fp16, 9200);
  VarlenBackwardCase one;
  one.shape = ragged({257}, {257}, 2, 2, 64, true, 9201);
  check_in_every_family(one, 9201);
  std::mt19937 rng(9202);
  std::vector<int> q, k;
  for (int i = 0; i < 40; ++i) {
    q.push_back(static_cast<int>(rng() % 160));
    k.push_back(static_cast<int>(rng() % 160));
  }
  VarlenBackwardCase many;
  many.shape = ragged(q, k, 4, 2, 64, false, 9203);
  check_in_every_family(many, 9203);
}

TEST_CASE("varlen backward of the score variants: window with sink tokens, softcap, ALiBi, sinks") {
  unsigned seed = 9300;
  for (int head_dim : {64, 128}) {
    VarlenBackwardCase window;
    window.shape = ragged({0, 70, 200, 130, 1}, {3, 70, 260, 130, 9}, 4, 2, head_dim, true, seed);
    window.window_left = 48, window.window_right = 0, window.sink_tokens = 4;
    window.softcap = 20.f;
    check_in_every_family(window, seed++);
    VarlenBackwardCase biased;
    biased.shape = ragged({90, 200, 33}, {150, 200, 33}, 4, 4, head_dim, false, seed);
    biased.alibi = true, biased.sinks = true;
    check_in_every_family(biased, seed++);
  }
}

TEST_CASE("varlen backward: the deterministic mode repeats bitwise") {
  for (int head_dim : {64, 128}) {
    VarlenBackwardCase c;
    c.shape = ragged({0, 65, 200, 129}, {10, 65, 300, 1}, 8, 2, head_dim, true, 9400);
    c.deterministic = true;
    check_in_every_family(c, 9400 + static_cast<unsigned>(head_dim));
  }
}

TEST_CASE("varlen backward with user functions: prefix LM per sequence, a relative-position bias") {
  // The prefix mask reads the sequence (batch) and positions within it; the bias its derivative.
  static const UserFunctions prefix = prefix_lm_functions();
  static const UserFunctions bias = relative_position_bias_functions();
  std::mt19937 rng(9900);
  for (int head_dim : {64, 128}) {
    VarlenBackwardCase masked;
    masked.shape = ragged({0, 90, 200, 130, 1}, {3, 90, 260, 130, 9}, 4, 2, head_dim, false,
                          9900 + head_dim);
    std::vector<std::int32_t> prefix_of;
    for (int length : masked.shape.seqlens_k)
      prefix_of.push_back(length > 0 ? static_cast<std::int32_t>(rng() % length) : 0);
    const DeviceBuffer prefix_args = device_copy(engine(), prefix_of);
    masked.user_functions = &prefix;
    masked.user_args[0] = prefix_args.data();
    masked.mask_mod = prefix_lm(prefix_of);
    check_in_every_family(masked, 9910 + head_dim);

    VarlenBackwardCase biased;
    biased.shape = ragged({70, 150, 33}, {120, 150, 33}, 4, 4, head_dim, true, 9920 + head_dim);
    std::vector<float> table(
        static_cast<std::size_t>(4 * (2 * relative_position_range() + 1)));
    std::normal_distribution<float> normal(0.f, 1.f);
    for (float& x : table) x = normal(rng);
    const DeviceBuffer table_args = device_copy(engine(), table);
    biased.user_functions = &bias;
    biased.user_args[0] = table_args.data();
    biased.score_mod = relative_position_bias(table);
    biased.score_mod_grad = relative_position_bias_grad;
    check_in_every_family(biased, 9930 + head_dim);
  }
}

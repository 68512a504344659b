// The float64 reference gradients against finite differences of the float64 forward reference:
// the GPU backward tests trust reference_attention_backward, so it is checked on its own here.
#include <doctest/doctest.h>
#include <fmt/format.h>

#include <cmath>
#include <random>
#include <vector>

#include "reference.hpp"
#include "reference_backward.hpp"

namespace flashjit::test {
namespace {

// fp16 keeps 11 significant bits, so values that are multiples of 2^-6 in (-1.5, 1.5) stay exact
// when moved by the steps below (multiples of 2^-8 in (-2, 2) are fp16 values): the finite
// differences perturb the very numbers the reference reads, with no rounding in between.
constexpr DType kDType = DType::fp16;
constexpr double kStep = 1.0 / 256;
// Central differences at steps h and 2h combined by Richardson (error O(h^4) ~ 1e-10 here); the
// roundoff of L in double divided by h is ~1e-13.
constexpr double kTolerance = 1e-7;

HostTensor random_tensor(std::mt19937& rng, std::int64_t b, std::int64_t s, std::int64_t h,
                         std::int64_t d, bool bhsd) {
  HostTensor t = HostTensor::make(kDType, b, s, h, d, bhsd);
  std::uniform_int_distribution<int> sixty_fourths(-95, 95);
  for (auto& bits : t.bits)
    bits = from_float(kDType, static_cast<float>(sixty_fourths(rng) / 64.0));
  return t;
}

struct Problem {
  int batch, heads_q, heads_kv, seqlen_q, seqlen_k, head_dim;
  bool causal, bhsd;
  double scale;
  ScoreMods mods{};  // window, sink tokens, softcap, ALiBi, learnable sinks
  std::string describe() const {
    return fmt::format("b{} hq{} hkv{} sq{} sk{} d{} {} {} scale {} window ({}, {}) sink tokens "
                       "{} softcap {} alibi {} sinks {}",
                       batch, heads_q, heads_kv, seqlen_q, seqlen_k, head_dim,
                       causal ? "causal" : "full", bhsd ? "bhsd" : "bshd", scale,
                       mods.window_left, mods.window_right, mods.sink_tokens, mods.softcap,
                       !mods.alibi_slopes.empty(), !mods.sink_logits.empty());
  }
};

struct Inputs {
  HostTensor q, k, v, dout;
};

Inputs random_inputs(const Problem& p, unsigned seed) {
  std::mt19937 rng(seed);
  Inputs in{random_tensor(rng, p.batch, p.seqlen_q, p.heads_q, p.head_dim, p.bhsd),
            random_tensor(rng, p.batch, p.seqlen_k, p.heads_kv, p.head_dim, p.bhsd),
            random_tensor(rng, p.batch, p.seqlen_k, p.heads_kv, p.head_dim, p.bhsd),
            random_tensor(rng, p.batch, p.seqlen_q, p.heads_q, p.head_dim, p.bhsd)};
  return in;
}

// L = Σ out∘dout: the loss whose gradients Engine::backward computes when given dout.
double loss(const Inputs& in, const Problem& p) {
  const Reference ref = reference_attention(in.q, in.k, in.v, p.scale, p.causal, p.mods);
  double sum = 0;
  std::size_t flat = 0;  // ref.out is contiguous [b, s, h, d]
  const auto& shape = in.dout.view.shape;
  for (std::int64_t b = 0; b < shape[0]; ++b)
    for (std::int64_t s = 0; s < shape[1]; ++s)
      for (std::int64_t h = 0; h < shape[2]; ++h)
        for (std::int64_t d = 0; d < shape[3]; ++d) sum += ref.out[flat++] * in.dout.at(b, s, h, d);
  return sum;
}

// dL/d(element) by finite differences, moving one element of `tensor` (one of in's).
double finite_difference(Inputs& in, HostTensor& tensor, std::int64_t b, std::int64_t s,
                         std::int64_t h, std::int64_t d, const Problem& p) {
  const std::size_t at = static_cast<std::size_t>(tensor.offset(b, s, h, d));
  const std::uint16_t saved = tensor.bits[at];
  const double x = to_float(kDType, saved);
  auto loss_at = [&](double value) {
    tensor.bits[at] = from_float(kDType, static_cast<float>(value));
    REQUIRE(to_float(kDType, tensor.bits[at]) == value);  // the step is exact in fp16
    return loss(in, p);
  };
  auto central = [&](double step) { return (loss_at(x + step) - loss_at(x - step)) / (2 * step); };
  const double fine = central(kStep), coarse = central(2 * kStep);
  tensor.bits[at] = saved;
  return (4 * fine - coarse) / 3;
}

// Every element of `tensor` (contiguous [b, s, h, d] in `analytic`) against finite differences.
// Returns the largest |analytic| seen, so callers can check the gradient is not trivially zero.
double check_gradient(const char* name, Inputs& in, HostTensor& tensor,
                      const std::vector<double>& analytic, const Problem& p) {
  const auto& shape = tensor.view.shape;
  double largest = 0;
  std::size_t flat = 0;
  for (std::int64_t b = 0; b < shape[0]; ++b)
    for (std::int64_t s = 0; s < shape[1]; ++s)
      for (std::int64_t h = 0; h < shape[2]; ++h)
        for (std::int64_t d = 0; d < shape[3]; ++d, ++flat) {
          const double numeric = finite_difference(in, tensor, b, s, h, d, p);
          CAPTURE(fmt::format("{}[{}, {}, {}, {}]", name, b, s, h, d));
          CHECK(std::abs(analytic[flat] - numeric) <= kTolerance);
          largest = std::max(largest, std::abs(analytic[flat]));
        }
  return largest;
}

void check_against_finite_differences(const Problem& p, unsigned seed) {
  CAPTURE(p.describe());
  Inputs in = random_inputs(p, seed);
  const ReferenceGradients g =
      reference_attention_backward(in.q, in.k, in.v, in.dout, p.scale, p.causal, p.mods);
  CHECK(check_gradient("dq", in, in.q, g.dq, p) > 0.05);
  CHECK(check_gradient("dk", in, in.k, g.dk, p) > 0.05);
  CHECK(check_gradient("dv", in, in.v, g.dv, p) > 0.05);
  // The sink logits are doubles: central differences on them directly.
  REQUIRE(g.dsink.size() == p.mods.sink_logits.size());
  double largest = 0;
  for (std::size_t h = 0; h < g.dsink.size(); ++h) {
    Problem moved = p;
    auto loss_at = [&](double step) {
      moved.mods.sink_logits[h] = p.mods.sink_logits[h] + step;
      return loss(in, moved);
    };
    auto central = [&](double step) { return (loss_at(step) - loss_at(-step)) / (2 * step); };
    const double numeric = (4 * central(kStep) - central(2 * kStep)) / 3;
    CAPTURE(h);
    CHECK(std::abs(g.dsink[h] - numeric) <= kTolerance);
    largest = std::max(largest, std::abs(g.dsink[h]));
  }
  if (!g.dsink.empty()) CHECK(largest > 1e-3);
}

}  // namespace

TEST_CASE("reference backward: gradients match finite differences of the forward reference") {
  unsigned seed = 31;
  for (bool causal : {false, true}) {
    // GQA 2:1, sq > sk: with causal, rows 0 and 1 sit before key 0 and see nothing.
    check_against_finite_differences({1, 2, 1, 5, 3, 4, causal, false, 0.5}, seed++);
    // sq < sk, batch 2, strided BHSD views, one head per KV head, the default scale.
    check_against_finite_differences({2, 2, 2, 2, 5, 4, causal, true, 0.5}, seed++);
    // MQA 3:1 on a square problem, a large scale (peaked softmax).
    check_against_finite_differences({1, 3, 1, 4, 4, 3, causal, false, 1.7}, seed++);
  }
}

TEST_CASE("reference backward: soft-capping, windows, sink tokens, ALiBi and learnable sinks") {
  unsigned seed = 71;
  for (bool causal : {false, true}) {
    ScoreMods capped;
    capped.softcap = 0.8;  // small: the 1 - tanh² factor matters
    check_against_finite_differences({1, 2, 1, 5, 6, 4, causal, false, 1.3, capped}, seed++);
    ScoreMods window;  // rows see 2 keys left (+ the first as a sink token), 1 right unless causal
    window.window_left = 2;
    window.window_right = 1;
    window.sink_tokens = 1;
    check_against_finite_differences({1, 2, 2, 6, 7, 4, causal, false, 0.7, window}, seed++);
    ScoreMods biased;
    biased.alibi_slopes = {0.5, 0.125};
    biased.sink_logits = {0.3, -0.4};
    check_against_finite_differences({1, 2, 1, 4, 5, 4, causal, true, 0.9, biased}, seed++);
    ScoreMods all = window;
    all.softcap = 1.1;
    all.alibi_slopes = {0.25, 0.0625};
    all.sink_logits = {1.5, -0.2};
    check_against_finite_differences({2, 2, 1, 5, 5, 3, causal, false, 1.0, all}, seed++);
  }
}

TEST_CASE("reference backward: rows that see no key get exact zeros and add nothing") {
  const Problem p{1, 2, 1, 5, 3, 4, true, false, 0.5};
  Inputs in = random_inputs(p, 7);
  const ReferenceGradients g = reference_attention_backward(in.q, in.k, in.v, in.dout, 0.5, true);
  // Query i sits at key position i - 2: rows 0 and 1 see nothing, every key is seen by row 4.
  CHECK(g.query_sees_nothing == std::vector<bool>{true, true, false, false, false});
  CHECK(g.key_seen_by_none == std::vector<bool>{false, false, false});
  for (std::size_t i = 0; i < 2 * 2 * 4; ++i) CHECK(g.dq[i] == 0.0);  // rows 0, 1, both heads
  // Changing what those rows hold (q and dout) changes no gradient of the others.
  Inputs changed = in;
  for (std::int64_t s : {0, 1})
    for (std::int64_t h = 0; h < 2; ++h)
      for (std::int64_t d = 0; d < 4; ++d) {
        changed.q.bits[static_cast<std::size_t>(changed.q.offset(0, s, h, d))] =
            from_float(kDType, 1.25f);
        changed.dout.bits[static_cast<std::size_t>(changed.dout.offset(0, s, h, d))] =
            from_float(kDType, -0.75f);
      }
  const ReferenceGradients same =
      reference_attention_backward(changed.q, changed.k, changed.v, changed.dout, 0.5, true);
  CHECK(same.dq == g.dq);
  CHECK(same.dk == g.dk);
  CHECK(same.dv == g.dv);
}

TEST_CASE("reference backward: no queries give zero dk and dv, every key unseen") {
  const Problem p{1, 2, 1, 0, 3, 4, false, false, 0.5};
  Inputs in = random_inputs(p, 8);
  const ReferenceGradients g = reference_attention_backward(in.q, in.k, in.v, in.dout, 0.5, false);
  CHECK(g.dq.empty());
  CHECK(g.key_seen_by_none == std::vector<bool>{true, true, true});
  CHECK(g.dk == std::vector<double>(12, 0.0));
  CHECK(g.dv == std::vector<double>(12, 0.0));
}

TEST_CASE("reference backward: one key per row: dv is dout, dq and dk vanish") {
  // Causal sq == sk == 1 (and row 0 of any causal square problem): P = 1, so dS = P∘(dP − D) =
  // 0 exactly; a kernel's rounded P makes these small but not zero, which its bounds allow.
  const Problem p{1, 1, 1, 1, 1, 8, true, false, 0.5};
  Inputs in = random_inputs(p, 9);
  const ReferenceGradients g = reference_attention_backward(in.q, in.k, in.v, in.dout, 0.5, true);
  for (std::int64_t d = 0; d < 8; ++d) {
    CHECK(g.dv[d] == in.dout.at(0, 0, 0, d));
    CHECK(g.dq[d] == 0.0);
    CHECK(g.dk[d] == 0.0);
  }
}

}  // namespace flashjit::test

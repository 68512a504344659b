// The float64 reference's score modifications (sliding window, StreamingLLM sink tokens, softcap,
// ALiBi, gpt-oss sinks, user functions) on cases small enough to work out by hand: the GPU tests of
// those variants trust it.
#include <doctest/doctest.h>

#include <cmath>
#include <initializer_list>
#include <limits>
#include <vector>

#include "reference.hpp"

namespace flashjit::test {
namespace {

// One head of values [s][d] (exact in bf16: small integers and halves).
HostTensor tensor(std::int64_t s, std::int64_t d, std::initializer_list<float> values) {
  HostTensor t = HostTensor::make(DType::bf16, 1, s, 1, d, false);
  REQUIRE(values.size() == t.bits.size());
  std::size_t i = 0;
  for (float x : values) t.bits[i++] = from_float(DType::bf16, x);
  return t;
}

// Softmax-weighted mean of `values` under `scores` (-inf: masked), plus a sink logit.
struct Expected {
  double out, lse;
};
Expected expected(std::initializer_list<double> scores, std::initializer_list<double> values,
                  double sink = -std::numeric_limits<double>::infinity()) {
  double sum = std::exp(sink), weighted = 0;
  auto v = values.begin();
  for (double s : scores) {
    sum += std::exp(s);
    weighted += std::exp(s) * *v++;
  }
  return {weighted / sum, std::log(sum)};
}

constexpr double kNegInf = -std::numeric_limits<double>::infinity();

}  // namespace

TEST_CASE("reference: no modification is plain softmax attention, causal bottom-right") {
  // q of 2 rows over 3 keys, d = 1: scores are q * k.
  const HostTensor q = tensor(2, 1, {1, 0.5f}), k = tensor(3, 1, {1, 2, -1}),
                   v = tensor(3, 1, {3, 5, 7});
  const Reference full = reference_attention(q, k, v, 1.0, false);
  const Expected row0 = expected({1, 2, -1}, {3, 5, 7});
  CHECK(full.out[0] == doctest::Approx(row0.out));
  CHECK(full.lse[0] == doctest::Approx(row0.lse));
  // Causal: row 0 sits at key position 1 (3 - 2), so it sees keys 0 and 1.
  const Reference causal = reference_attention(q, k, v, 1.0, true);
  CHECK(causal.out[0] == doctest::Approx(expected({1, 2}, {3, 5}).out));
  CHECK(causal.out[1] == doctest::Approx(expected({0.5, 1, -0.5}, {3, 5, 7}).out));
}

TEST_CASE("reference: sliding window, with causal and with StreamingLLM sink tokens") {
  const HostTensor q = tensor(4, 1, {1, 1, 1, 1}), k = tensor(4, 1, {1, 2, 3, 4}),
                   v = tensor(4, 1, {10, 20, 30, 40});
  ScoreMods only_self;
  only_self.window_left = only_self.window_right = 0;
  const Reference self = reference_attention(q, k, v, 1.0, false, only_self);
  for (int i = 0; i < 4; ++i) {
    CHECK(self.out[i] == doctest::Approx(10.0 * (i + 1)));
    CHECK(self.lse[i] == doctest::Approx(i + 1.0));
  }
  ScoreMods left_one;
  left_one.window_left = 1;  // right unbounded, but causal caps it at the query
  const Reference local = reference_attention(q, k, v, 1.0, true, left_one);
  CHECK(local.out[0] == doctest::Approx(10));
  CHECK(local.out[3] == doctest::Approx(expected({3, 4}, {30, 40}).out));
  ScoreMods right_one;
  right_one.window_left = 0, right_one.window_right = 1;
  const Reference ahead = reference_attention(q, k, v, 1.0, false, right_one);
  CHECK(ahead.out[1] == doctest::Approx(expected({2, 3}, {20, 30}).out));
  CHECK(ahead.out[3] == doctest::Approx(40));
  ScoreMods streaming;
  streaming.window_left = 0, streaming.sink_tokens = 1;
  const Reference kept = reference_attention(q, k, v, 1.0, true, streaming);
  CHECK(kept.out[0] == doctest::Approx(10));
  CHECK(kept.out[3] == doctest::Approx(expected({1, 4}, {10, 40}).out));
}

TEST_CASE("reference: softcap bounds scores, before ALiBi; large inputs stay finite") {
  const HostTensor q = tensor(1, 1, {2}), k = tensor(2, 1, {1, 256}), v = tensor(2, 1, {1, 3});
  ScoreMods capped;
  capped.softcap = 4;
  const Reference c = reference_attention(q, k, v, 0.5, false, capped);  // s = 1 and 256
  const Expected e = expected({4 * std::tanh(0.25), 4 * std::tanh(64.0)}, {1, 3});
  CHECK(c.out[0] == doctest::Approx(e.out));
  CHECK(c.lse[0] == doctest::Approx(e.lse));
  CHECK(std::isfinite(c.lse[0]));
  // ALiBi after the cap: the query sits at key position 1, so key 0 is 1 away.
  capped.alibi_slopes = {0.75};
  const Reference a = reference_attention(q, k, v, 0.5, false, capped);
  CHECK(a.out[0] ==
        doctest::Approx(expected({4 * std::tanh(0.25) - 0.75, 4 * std::tanh(64.0)}, {1, 3}).out));
}

TEST_CASE("reference: ALiBi slopes are per query head, bottom-right relative positions") {
  // Two query heads on one KV head, 1 query over 3 keys, all scores 0 before the bias.
  HostTensor q = HostTensor::make(DType::bf16, 1, 1, 2, 1, false);
  q.fill(from_float(DType::bf16, 0));
  const HostTensor k = tensor(3, 1, {1, 1, 1}), v = tensor(3, 1, {1, 2, 4});
  ScoreMods mods;
  mods.alibi_slopes = {0.5, 0};
  const Reference r = reference_attention(q, k, v, 1.0, false, mods);
  CHECK(r.out[0] == doctest::Approx(expected({-1, -0.5, 0}, {1, 2, 4}).out));  // head 0
  CHECK(r.out[1] == doctest::Approx(7.0 / 3));                                 // head 1: no bias
}

TEST_CASE("reference: a sink logit joins the denominator and the LSE, and fills empty rows") {
  const HostTensor q = tensor(2, 1, {1, 1}), k = tensor(1, 1, {2}), v = tensor(1, 1, {6});
  ScoreMods mods;
  mods.sink_logits = {1.5};
  // Causal, 2 queries over 1 key: row 0 sits at key position -1 and sees nothing.
  const Reference r = reference_attention(q, k, v, 1.0, true, mods);
  CHECK(r.out[0] == 0);
  CHECK(r.lse[0] == doctest::Approx(1.5));
  const Expected row1 = expected({2}, {6}, 1.5);
  CHECK(r.out[1] == doctest::Approx(row1.out));
  CHECK(r.lse[1] == doctest::Approx(row1.lse));
  // Without the sink the empty row has LSE -inf, never NaN.
  const Reference plain = reference_attention(q, k, v, 1.0, true);
  CHECK(plain.out[0] == 0);
  CHECK(plain.lse[0] == kNegInf);
  // A dominating sink drives the output to 0 without overflow.
  mods.sink_logits = {1000};
  const Reference big = reference_attention(q, k, v, 1.0, true, mods);
  CHECK(std::abs(big.out[1]) < 1e-300);
  CHECK(big.lse[1] == doctest::Approx(1000));
}

TEST_CASE("reference: score_mod takes the capped, biased score in order; mask_mod adds to causal") {
  // 2 queries over 3 keys, causal: row 0 sits at key position 1, row 1 at 2.
  const HostTensor q = tensor(2, 1, {1, 2}), k = tensor(3, 1, {1, 2, -1}),
                   v = tensor(3, 1, {3, 5, 7});
  struct Call {
    double score;
    int batch, head, q_idx, kv_idx;
  };
  std::vector<Call> calls;
  ScoreMods mods;
  mods.softcap = 4;
  mods.alibi_slopes = {0.25};
  mods.first_batch = 5;
  mods.score_mod = [&](double score, int batch, int head, int q_idx, int kv_idx) {
    calls.push_back({score, batch, head, q_idx, kv_idx});
    return score + kv_idx;
  };
  const Reference r = reference_attention(q, k, v, 0.5, true, mods);
  // Called once per visible (query, key), never for the key causal hides (row 0, key 2).
  REQUIRE(calls.size() == 5);
  auto capped = [&](double qk, int distance) {
    return 4 * std::tanh(0.5 * qk / 4) - 0.25 * distance;
  };
  for (const Call& call : calls) {
    CAPTURE(call.q_idx);
    CAPTURE(call.kv_idx);
    CHECK(call.batch == 5);
    CHECK(call.head == 0);
    const double qk = (call.q_idx + 1.0) * (call.kv_idx == 0 ? 1 : call.kv_idx == 1 ? 2 : -1);
    CHECK(call.score == doctest::Approx(capped(qk, std::abs(call.q_idx + 1 - call.kv_idx))));
  }
  const Expected row0 = expected({capped(1, 1), capped(2, 0) + 1}, {3, 5});
  CHECK(r.out[0] == doctest::Approx(row0.out));
  CHECK(r.lse[0] == doctest::Approx(row0.lse));
  const Expected row1 = expected({capped(2, 2), capped(4, 1) + 1, capped(-2, 0) + 2}, {3, 5, 7});
  CHECK(r.out[1] == doctest::Approx(row1.out));
  CHECK(r.lse[1] == doctest::Approx(row1.lse));

  // mask_mod hides key 1 from every row and every key from row 0: row 0 sees nothing (0, -inf),
  // row 1 keys 0 and 2; score_mod is not called for hidden keys.
  calls.clear();
  mods.mask_mod = [](int batch, int head, int q_idx, int kv_idx) {
    CHECK(batch == 5);
    CHECK(head == 0);
    return q_idx != 0 && kv_idx != 1;
  };
  const Reference masked = reference_attention(q, k, v, 0.5, true, mods);
  CHECK(calls.size() == 2);
  CHECK(masked.out[0] == 0);
  CHECK(masked.lse[0] == kNegInf);
  const Expected kept = expected({capped(2, 2), capped(-2, 0) + 2}, {3, 7});
  CHECK(masked.out[1] == doctest::Approx(kept.out));
  CHECK(masked.lse[1] == doctest::Approx(kept.lse));
}

}  // namespace flashjit::test

// Numerics at the edges, for every kernel family on this GPU: logits of magnitude 1e4 and more,
// rows that see no key, seqlen 1, padded (aligned but not contiguous) strides, and bitwise
// determinism. A family that does not handle a case reports Error(unsupported): skipped, visibly.
#include <doctest/doctest.h>
#include <fmt/format.h>

#include <optional>
#include <string>
#include <vector>

#include "gpu.hpp"
#include "numerics_case.hpp"

using namespace flashjit;
using namespace flashjit::test;

namespace {

// The result, or nullopt after a MESSAGE (unsupported) or a failure (any other error).
std::optional<NumericsResult> run(const NumericsCase& c, const std::string& family, unsigned seed) {
  try {
    return run_numerics_case(shared_engine(), c, family, seed);
  } catch (const Error& e) {
    if (e.code() == ErrorCode::unsupported)
      MESSAGE(fmt::format("{} not run on {}: {}", family, c.shape.describe(), e.what()));
    else
      FAIL_CHECK(fmt::format("{} {}: {}", family, c.shape.describe(), e.what()));
    return std::nullopt;
  }
}

// Output and LSE match the float64 reference within the usual bounds (compare.hpp); the LSE
// bound grows with the logits, whose fp32 rounding is relative.
void check_accuracy(const NumericsResult& r, const NumericsCase& c) {
  CAPTURE(r.check.variant);
  CAPTURE(c.shape.describe());
  CHECK(r.check.all_written);
  CHECK(r.check.max_abs_error <= max_abs_tolerance(c.shape.dtype, r.check.max_abs_reference));
  CHECK(r.check.relative_l2_error <= relative_tolerance(c.shape.dtype));
  CHECK(r.check.max_lse_error <= kLseTolerance + 4e-6 * r.max_abs_logit);
  MESSAGE(fmt::format("{:<45} {:<40} max|logit| {:.3g} max_abs {:.2e} rel {:.2e} lse {:.2e}",
                      r.check.variant, c.shape.describe(), r.max_abs_logit, r.check.max_abs_error,
                      r.check.relative_l2_error, r.check.max_lse_error));
}

NumericsCase large_logits(ForwardCase shape, double input_scale,
                          std::optional<float> softmax_scale = {}) {
  NumericsCase c;
  c.shape = shape;
  c.q_scale = c.k_scale = input_scale;
  c.softmax_scale = softmax_scale;
  return c;
}

// Rows i < seqlen_q - seqlen_k see no key under the bottom-right causal mask.
void check_fully_masked_rows(const NumericsResult& r, const ForwardCase& s) {
  int masked = 0, nonzero = 0;
  for (int b = 0; b < s.batch; ++b)
    for (int i = 0; i < s.seqlen_q - s.seqlen_k; ++i)
      for (int h = 0; h < s.heads_q; ++h, ++masked) nonzero += !row_is_zero(r.out, b, i, h);
  CAPTURE(r.check.variant);
  CHECK(masked > 0);
  CHECK(nonzero == 0);
}

}  // namespace

TEST_CASE("logits of magnitude 1e4 and more stay finite and accurate") {
  // q, k ~ N(0, 64^2): with the default scale 1/sqrt(d) a logit is N(0, 4096^2), so the largest
  // of thousands passes 1e4; the softmax_scale case gets there from unit inputs.
  const std::vector<NumericsCase> cases = {
      large_logits({2, 2, 2, 128, 128, 64, false}, 64),
      large_logits({2, 2, 2, 128, 128, 64, true}, 64),
      large_logits({1, 4, 2, 96, 160, 128, false, DType::fp16}, 64),
      large_logits({1, 2, 1, 100, 100, 128, false}, 1, 1000.f),
      large_logits({1, 2, 2, 64, 200, 256, true, DType::fp16}, 1, 1000.f),
  };
  unsigned seed = 100;
  for (const std::string& family : family_names())
    for (const NumericsCase& c : cases)
      if (auto r = run(c, family, seed++)) {
        CHECK(r->max_abs_logit >= 1e4);
        check_accuracy(*r, c);
      }
}

TEST_CASE("rows that see no key give output 0 and LSE -inf, also next to huge logits") {
  const std::vector<NumericsCase> cases = {
      large_logits({2, 4, 2, 200, 50, 64, true}, 1),
      large_logits({1, 2, 1, 130, 1, 128, true}, 1),
      large_logits({1, 2, 2, 70, 64, 256, true, DType::fp16}, 1),
      // A finite "minus infinity" for masked scores would lose against logits near -1e4.
      large_logits({2, 2, 2, 160, 96, 64, true}, 64),
      large_logits({1, 2, 1, 150, 40, 128, true, DType::fp16}, 64),
  };
  unsigned seed = 200;
  for (const std::string& family : family_names())
    for (const NumericsCase& c : cases)
      if (auto r = run(c, family, seed++)) {
        check_fully_masked_rows(*r, c.shape);
        check_accuracy(*r, c);
      }
}

TEST_CASE("seqlen 1 on either side") {
  std::vector<NumericsCase> cases;
  for (int d : supported_head_dims()) {
    cases.push_back(large_logits({1, 2, 2, 1, 1, d, false}, 1));
    cases.push_back(large_logits({2, 4, 2, 1, 300, d, true}, 1));
  }
  cases.push_back(large_logits({1, 2, 1, 77, 1, 64, false}, 1));
  cases.push_back(large_logits({1, 2, 1, 77, 1, 128, true}, 1));  // only the last row sees the key
  cases.push_back(large_logits({3, 8, 1, 1, 1, 256, true, DType::fp16}, 1));
  unsigned seed = 300;
  for (const std::string& family : family_names())
    for (const NumericsCase& c : cases)
      if (auto r = run(c, family, seed++)) check_accuracy(*r, c);
}

TEST_CASE("padded strides (aligned, not contiguous) are read and written exactly") {
  auto padded = [](ForwardCase shape, std::array<std::int64_t, 3> padding) {
    NumericsCase c;
    c.shape = shape;
    c.padding = padding;
    return c;
  };
  const std::vector<NumericsCase> cases = {
      // stride[1] = heads * d + 8: rows that do not follow each other
      padded({2, 4, 2, 100, 130, 64, false}, {0, 8, 0}),
      padded({1, 4, 4, 64, 64, 128, true}, {8, 8, 24}),
      padded({2, 2, 1, 33, 257, 256, false, DType::fp16}, {8, 16, 8}),
      padded({1, 6, 2, 190, 77, 96, true}, {0, 8, 8}),
      padded({2, 2, 2, 129, 129, 32, false, DType::fp16}, {24, 0, 0}),
  };
  unsigned seed = 400;
  for (const std::string& family : family_names())
    for (const NumericsCase& c : cases)
      if (auto r = run(c, family, seed++)) {
        CAPTURE(r->check.variant);
        CHECK(r->gaps_untouched);  // nothing written between the rows
        check_accuracy(*r, c);
      }
}

TEST_CASE("the same input twice gives bitwise the same output, whatever the buffer held") {
  const std::vector<ForwardCase> shapes = {
      {2, 4, 2, 333, 333, 128, true},
      {1, 8, 1, 200, 517, 64, false, DType::fp16},
      {3, 2, 2, 77, 1000, 256, true},
  };
  for (const std::string& family : family_names())
    for (const ForwardCase& shape : shapes) {
      NumericsCase c;
      c.shape = shape;
      c.poison = 0xff;
      const auto first = run(c, family, 500);
      c.poison = 0x00;
      const auto second = run(c, family, 500);
      if (!first || !second) continue;
      CAPTURE(first->check.variant);
      CAPTURE(shape.describe());
      CHECK(first->check.all_written);
      CHECK(first->out.bits == second->out.bits);
    }
}

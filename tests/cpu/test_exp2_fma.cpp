// exp2_fma (kernels_src/common/exp2_fma.cuh), the FMA-pipe 2^x the wgmma kernel's soft-capped d64
// scores use for 3 of every 8 columns: its relative error against std::exp2 over the domain the
// kernel feeds it. g++ runs the same float operations (explicit fmaf, no contraction to differ).
#include <doctest/doctest.h>

#include <cmath>
#include <random>

#include "common/exp2_fma.cuh"

using flashjit::exp2_fma;
using flashjit::kExp2FmaMaxRelativeError;

namespace {

double relative_error(float x) {
  const double exact = std::exp2(static_cast<double>(x));
  return std::abs(static_cast<double>(exp2_fma(x)) - exact) / exact;
}

}  // namespace

TEST_CASE("exp2_fma: relative error within its bound on the whole domain") {
  // The bounded softcap path's exponents lie in [-126, 32]; the function promises [-126, 64).
  double worst = 0.0;
  float worst_at = 0.f;
  auto check = [&](float x) {
    const double e = relative_error(x);
    if (e > worst) {
      worst = e;
      worst_at = x;
    }
  };
  // Every float in one unit interval around 0 at 2^-20 steps: f covers [-0.5, 0.5] densely,
  // and the integer part only moves the exponent bits.
  for (int i = -(1 << 20); i <= (1 << 20); ++i) check(static_cast<float>(i) * 0x1p-20f);
  // Random points on the whole domain, integers and half-integers (the rounding boundaries).
  std::mt19937 rng(20261207);
  std::uniform_real_distribution<float> domain(-126.f, 64.f);
  for (int i = 0; i < 2'000'000; ++i) check(domain(rng));
  for (int n = -126; n < 64; ++n) {
    check(static_cast<float>(n));
    check(static_cast<float>(n) + 0.5f);
    check(std::nextafter(static_cast<float>(n) + 0.5f, 0.f));
  }
  MESSAGE("exp2_fma: worst relative error ", worst, " at x = ", worst_at);
  CHECK(worst <= kExp2FmaMaxRelativeError);
  // The bound is the polynomial's, not slack: it is nearly reached.
  CHECK(worst >= 0.5 * kExp2FmaMaxRelativeError);
}

TEST_CASE("exp2_fma: exact powers of two scale the polynomial exactly") {
  // 2^(n + f) = 2^n * p(f) bit for bit, for f that n + f holds exactly (and away from the
  // rounding ties at +-0.5, where f flips sign with n's parity).
  for (const float f : {-0.4375f, -0.3125f, -0.0625f, 0.f, 0.125f, 0.375f}) {
    const float base = exp2_fma(f);
    for (int n = -120; n < 60; n += 7) {
      CAPTURE(f);
      CAPTURE(n);
      CHECK(exp2_fma(static_cast<float>(n) + f) == std::ldexp(base, n));
    }
  }
}

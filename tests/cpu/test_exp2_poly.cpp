// exp2 on the FMA pipe (kernels_src/common/exp2_poly.cuh), the host running the very code the
// kernels do, against 2^y in double: every float input over the ranges the kernels use.
#include <doctest/doctest.h>

#include <cmath>

#include "common/exp2_poly.cuh"

namespace flashjit {
namespace {

// The largest relative error of exp2_poly<Range, Offset>(u) / kExp2PolyScale against
// 2^(Range u - Offset) over every float u in [lo, hi] (Range u - Offset is exact in double).
template <int Range, int Offset>
double max_relative_error(float lo, float hi) {
  double worst = 0;
  for (unsigned bits = float_bits(lo); bits <= float_bits(hi); ++bits) {
    const float u = float_from_bits(bits);
    const double exact = std::exp2(static_cast<double>(Range) * u - Offset);
    worst = std::fmax(worst, std::fabs(exp2_poly<Range, Offset>(u) / kExp2PolyScale / exact - 1));
  }
  return worst;
}

}  // namespace

TEST_CASE("exp2_poly: the polynomial is within 2.75e-6 of 2^f over the whole reduced range") {
  // Range 2, Offset 1: u in [1/4, 3/4] is y = 2u - 1 in [-1/2, 1/2], all of it at n = 0, and the
  // polynomial is the same for every Range (its coefficients scale by powers of two).
  const double worst = max_relative_error<2, 1>(0.25f, 0.75f);
  CHECK(worst < 2.75e-6);
  CHECK(worst > 2.5e-6);  // a minimax: the bound is reached, not a loose one
}

TEST_CASE("exp2_poly: the soft-cap's range keeps the error, from 2^-28 to 2^36") {
  // Every u where y is in [-12, 36], the whole of [-28, -12] on a 2^-6 grid of f, and the ends.
  CHECK(max_relative_error<64, 28>(0.25f, 1.f) < 2.75e-6);
  double worst = 0;
  for (float u = 0.f; u < 0.25f; u += 1.f / (64 * 64)) {
    const double exact = std::exp2(64.0 * u - 28);
    worst = std::fmax(worst, std::fabs(exp2_poly<64, 28>(u) / kExp2PolyScale / exact - 1));
  }
  CHECK(worst < 2.75e-6);
  CHECK(exp2_poly<64, 28>(0.f) / kExp2PolyScale == doctest::Approx(0x1p-28).epsilon(3e-6));
  CHECK(exp2_poly<64, 28>(1.f) / kExp2PolyScale == doctest::Approx(0x1p36).epsilon(3e-6));
}

TEST_CASE("exp2_poly: kLog2Exp2PolyScale is log2(kExp2PolyScale), to a float") {
  // SoftCap::unit_sfu scales its ex2 by it: the SFU's and the polynomial's capped scores must
  // agree in scale.
  CHECK(std::exp2(double{kLog2Exp2PolyScale}) == doctest::Approx(kExp2PolyScale).epsilon(1e-7));
}

}  // namespace flashjit

// The soft-cap's tanh (kernels_src/common/softcap.cuh), the host running the kernels' code with
// an exact reciprocal where they use rcp.approx (within an ulp of it: at most 1.2e-7 more, as
// 2 / (e + 1) <= 2), against tanh in double.
#include <doctest/doctest.h>

#include <cmath>
#include <initializer_list>
#include <limits>

#include "common/softcap.cuh"

namespace flashjit {
namespace {

// What the Hopper kernel's softmax computes from SoftCap::unit (it folds score()'s multiply-add
// into its own scale and row max).
struct Capped {
  SoftCap soft_cap;
  float operator()(float x) const { return soft_cap.score(soft_cap.unit(x)); }
};

Capped soft_cap_of(float softcap, float softcap_scale) {
  FmhaParams p{};
  p.softcap = softcap;
  p.softcap_scale = softcap_scale;
  return {SoftCap(p)};
}

// The largest |capped(x) - cap · tanh(x · scale)| / cap over x = from, from + step, ... to.
double max_error(const Capped& capped, float scale, double from, double to, double step) {
  double worst = 0;
  for (double x = from; x <= to; x += step) {
    const float xf = static_cast<float>(x);
    worst = std::fmax(worst,
                      std::fabs(capped(xf) / capped.soft_cap.cap - std::tanh(double(xf) * scale)));
  }
  return worst;
}

}  // namespace

TEST_CASE("soft-cap: tanh within 1.9e-6, every 32nd float in [-1, 1] and densely out to 20") {
  const Capped tanh_of = soft_cap_of(1.f, 1.f);
  double worst = 0;
  for (unsigned bits = float_bits(0x1p-10f); bits <= float_bits(1.f); bits += 32)
    for (float x : {float_from_bits(bits), -float_from_bits(bits)})
      worst = std::fmax(worst, std::fabs(tanh_of(x) - std::tanh(double(x))));
  CHECK(worst < 1.9e-6);
  CHECK(max_error(tanh_of, 1.f, -20, 20, 3e-5) < 1.9e-6);
  CHECK(std::fabs(tanh_of(0.f)) < 1e-6);  // within the bound at 0 too, where tanh is steepest
}

TEST_CASE("soft-cap: Gemma 2's caps keep the error relative to the cap") {
  // Raw scores q·k at d = 128: the scale 1 / sqrt(128) / cap.
  for (float cap : {30.f, 50.f}) {
    const float scale = 1.f / std::sqrt(128.f) / cap;
    CHECK(max_error(soft_cap_of(cap, scale), scale, -5000, 5000, 0.05) < 1.9e-6);
  }
}

TEST_CASE("soft-cap: huge and infinite logits saturate to +-softcap, never NaN") {
  const Capped capped = soft_cap_of(50.f, 1.f / std::sqrt(128.f) / 50.f);
  const float huge = std::numeric_limits<float>::max(),
              inf = std::numeric_limits<float>::infinity();
  // -softcap within 2e-7 (2 ulps): 1 / kExp2PolyScale times 2 · kExp2PolyScale · softcap need
  // not round to 2 · softcap.
  auto near_minus_cap = [](float y) { return y == doctest::Approx(-50.f).epsilon(2e-7); };
  for (float x : {1e4f, 1e8f, huge, inf}) {
    CHECK(capped(x) == 50.f);
    CHECK(near_minus_cap(capped(-x)));
  }
  // Where tanh leaves +-1 in float (|x| · scale ~ 9), no jump: the clamp is past it.
  CHECK(capped(9.5f * std::sqrt(128.f) * 50.f) == 50.f);
  CHECK(near_minus_cap(capped(-9.5f * std::sqrt(128.f) * 50.f)));
  CHECK(capped(8.f * std::sqrt(128.f) * 50.f) ==
        doctest::Approx(50.f * std::tanh(8.0)).epsilon(2e-6));
}

}  // namespace flashjit

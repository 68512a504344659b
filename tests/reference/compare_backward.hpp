// How far a backward's dq, dk, dv are from the float64 reference gradients, and the pass bounds:
// one definition for the GPU tests (and any tool that checks gradients).
#pragma once

#include <array>
#include <cstddef>
#include <cstdint>
#include <string>
#include <vector>

#include "reference.hpp"
#include "reference_backward.hpp"

namespace flashjit::test {

// Bounds on max |g − ref| / max |ref| per gradient. Gradients go through more rounding than the
// output (P and dS rounded to 16 bits before their matmuls, dQ summed in fp32 over every key
// tile), so they sit above the forward's bounds (compare.hpp). First guesses: tune them on the
// GPU's numbers, here and nowhere else.
constexpr double kGradientToleranceBf16 = 2.5e-2;
constexpr double kGradientToleranceFp16 = 6e-3;
double gradient_tolerance(DType dtype);

struct GradientError {
  double max_abs_error = 0;      // over the finite elements
  double max_abs_reference = 0;  // the gradient's scale
  // max_abs_error / max_abs_reference: what the bound applies to. A gradient that is zero
  // everywhere (no query saw any key) has max_abs_error itself, so it must be (near) zero.
  double relative_error = 0;
  std::array<std::int64_t, 4> worst{};  // [b, s, h, d] of the largest error
  double worst_got = 0, worst_want = 0;
  std::size_t not_finite = 0;   // NaN or inf elements (the poison is NaN)
  std::size_t poison_left = 0;  // elements still holding the poison bits: never written
  // Elements that the mask alone makes zero (ReferenceGradients::query_sees_nothing for dq,
  // key_seen_by_none for dk and dv) and that are not exactly zero.
  std::size_t nonzero_where_masked = 0;
};

struct GradientErrors {
  GradientError dq, dk, dv;
};

// dq, dk, dv as the GPU wrote them (each in its own view); `poison` the 16-bit pattern they
// held before the run (0xffff for a 0xff byte fill).
GradientErrors compare_backward(const HostTensor& dq, const HostTensor& dk, const HostTensor& dv,
                                const ReferenceGradients& reference, std::uint16_t poison = 0xffff);

// "dq 3.1e-03 (at [0, 17, 1, 5]: 0.1203 vs 0.1209) dk ... dv ...": for test logs.
std::string describe(const GradientErrors& errors);
// Empty when every bound holds, else what failed ("dk: relative error 0.04 > 0.025; ...").
std::string describe_failures(const GradientErrors& errors, DType dtype);

}  // namespace flashjit::test

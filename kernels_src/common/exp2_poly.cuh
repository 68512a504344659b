// exp2 on the FMA pipe instead of the SFU (MUFU.EX2): 2^y = 2^n · 2^f with n = round(y), a
// minimax polynomial for 2^f, and n added into the exponent bits. Plain C++ (the host's tests
// measure the very code kernels run); FlashAttention-4 does the same for part of its softmax.
#pragma once

#if !defined(__CUDACC_RTC__)
#include <cmath>  // fmaf; NVRTC has it built in
#endif

#include "common/float_bits.cuh"
#include "common/host_device.cuh"

namespace flashjit {

// exp2_poly returns 2^y times this, 1 / the polynomial's leading coefficient: evaluated monic,
// each Horner step takes one immediate, where a leading coefficient would hold a register for
// the whole loop (the Hopper kernel's consumers have none to spare: they spill).
constexpr float kExp2PolyScale = 104.492096f;
constexpr float kLog2Exp2PolyScale = 6.70725f;  // for an SFU exp2 in the same scale

FLASHJIT_HOST_DEVICE constexpr int log2_of(int power_of_two) {
  return power_of_two <= 1 ? 0 : 1 + log2_of(power_of_two / 2);
}

// 2^y · kExp2PolyScale for y = Range · u - Offset, u in [0, 1]: a caller's clamp of y is then a
// saturating FFMA's, free. Relative error < 2.75e-6 (tests/cpu/test_exp2_poly.cpp).
template <int Range, int Offset>
FLASHJIT_HOST_DEVICE inline float exp2_poly(float u) {
  static_assert(Range >= 1 && (Range & (Range - 1)) == 0, "Range: a power of two");
  static_assert(Offset <= 119 && Range - Offset <= 119, "2^y · kExp2PolyScale must be normal");
  // The polynomial runs in d = f / Range, exact: q(f) = Range^4 · (d^4 + a3 / Range · d^3 + ...),
  // and the Range^4 joins n in the exponent.
  constexpr int kRangeLog2 = log2_of(Range);
  // Adding 1.5 · 2^23 / Range rounds u to a multiple of 1 / Range on the FMA pipe (F2I and FRND
  // are slower on Hopper), leaving k = round(Range · u) in the low mantissa bits; the rest of the
  // shift turns them into n + 4 log2(Range). Both subtractions are exact.
  constexpr float kShift =
      1.5f * (1 << 23) / Range - static_cast<float>(Offset - 4 * kRangeLog2) / Range;
  const float shifted = u + kShift;
  const float d = u - (shifted - kShift);  // f / Range, f = y - n in [-1/2, 1/2]
  // Degree 4, minimax in relative error on [-1/2, 1/2] (2.6e-6 before rounding to float;
  // tools/exp2_minimax.py), over its leading coefficient. Degree 5 would be 7e-8 and an FFMA
  // more; 2e-6 on tanh puts a logit capped at 50 off by 1e-4, and soft-capped scores are
  // issue-bound once off the SFU.
  constexpr float r = Range;
  float q = d + 5.842974f / r;
  q = fmaf(q, d, 25.10396f / (r * r));
  q = fmaf(q, d, 72.42575f / (r * r * r));
  q = fmaf(q, d, 104.49202f / (r * r * r * r));
  // Adding (n + 4 log2(Range)) << 23 scales q by 2^n · Range^4 (the shift's own bits overflow
  // away).
  return float_from_bits(float_bits(q) + (float_bits(shifted) << 23));
}

}  // namespace flashjit

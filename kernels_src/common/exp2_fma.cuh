// 2^x on the FMA pipe instead of the SFU (MUFU.EX2), for loops the SFU bounds. Plain C++ read by
// NVRTC (the kernels) and by g++ (tests/cpu/test_exp2_fma.cpp checks its error bound).
#pragma once

#if !defined(__CUDACC_RTC__)
#include <cmath>
#endif

#include "common/host_device.cuh"

namespace flashjit {

// The same bits as another type (NVRTC and g++ both have the builtin).
template <typename To, typename From>
FLASHJIT_HOST_DEVICE inline To bits_as(From x) {
  static_assert(sizeof(To) == sizeof(From), "a reinterpretation of the same number of bits");
  return __builtin_bit_cast(To, x);
}

// Relative error of exp2_fma against 2^x over its domain (the minimax polynomial's bound).
constexpr float kExp2FmaMaxRelativeError = 7.5e-5f;

// 2^x for x in [-126, 64) (no inf, no NaN, no denormals): 2^round(x) from the exponent bits times
// a degree-3 minimax polynomial of 2^f, f = x - round(x) in [-0.5, 0.5]. Eight FMA-pipe
// instructions against one SFU op: it pays only where the SFU, not issue, bounds a loop. Degree 2
// (1.7e-3) was no faster on soft-capped d64 scores (docs/perf-log.md, session 42).
FLASHJIT_HOST_DEVICE inline float exp2_fma(float x) {
  constexpr float kRound = 12582912.f;  // 1.5 * 2^23: x + kRound holds round(x) in its low bits
  const float shifted = x + kRound;
  const float f = x - (shifted - kRound);
  const float p = fmaf(fmaf(fmaf(0.05517153f, f, 0.24261101f), f, 0.69326097f), f, 0.99992806f);
  // (round(x) << 23) + 1.0's bits, modulo 2^32 (unsigned: kRound's own bits, all above bit 8,
  // shift out of the word). Built in an integer register and applied by a float multiply (an
  // integer op writing the score registers themselves made ptxas serialize the wgmmas,
  // docs/perf-log.md session 32).
  const float two_n = bits_as<float>(bits_as<unsigned>(shifted) * (1u << 23) + 0x3f800000u);
  return p * two_n;
}

}  // namespace flashjit

// Special-function unit math used by the softmax: exp2 and reciprocal, approximate, denormals flushed.
#pragma once

namespace flashjit {

constexpr float kLog2eF = 1.4426950408889634f;       // log2(e): natural-log units to log2
constexpr float kLn2F = 0.69314718055994530942f;     // ln(2): log2 units to natural-log

__device__ __forceinline__ float neg_inf() { return __int_as_float(0xff800000); }

__device__ __forceinline__ float exp2_ftz(float x) {
  float y;
  asm("ex2.approx.ftz.f32 %0, %1;" : "=f"(y) : "f"(x));
  return y;
}
__device__ __forceinline__ float rcp_approx_ftz(float x) {
  float y;
  asm("rcp.approx.ftz.f32 %0, %1;" : "=f"(y) : "f"(x));
  return y;
}
__device__ __forceinline__ float log2_approx(float x) {
  float y;
  asm("lg2.approx.ftz.f32 %0, %1;" : "=f"(y) : "f"(x));
  return y;
}

// 2^x on the FMA and integer pipes, for kernels whose SFU is the bottleneck (soft-capping spends
// it on tanh too): x = n + f with n = round(x) (the 1.5 * 2^23 trick leaves n in the low bits)
// and f in [-0.5, 0.5], 2^f from a degree-4 minimax polynomial, n added to its exponent field.
// Within 2.7e-6 relative of 2^x for x in [-125, 125] (clamped there, so the result stays a
// normal float: never 0, never inf; callers that need an exact 0 for -inf use exp2_ftz).
__device__ __forceinline__ float exp2_fma(float x) {
  constexpr float kRound = 12582912.f;  // 1.5 * 2^23
  x = fminf(fmaxf(x, -125.f), 125.f);
  const float shifted = x + kRound;
  const float f = x - (shifted - kRound);
  float p = fmaf(9.570037015e-03f, f, 5.591769516e-02f);
  p = fmaf(p, f, 2.402474433e-01f);
  p = fmaf(p, f, 6.931218505e-01f);
  p = fmaf(p, f, 9.999992847e-01f);
  return __int_as_float(__float_as_int(p) + (__float_as_int(shifted) << 23));
}

}  // namespace flashjit

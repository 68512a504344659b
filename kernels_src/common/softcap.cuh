// Logit soft-capping (Gemma 2, Grok) for the variants built with it (Variant::softcap). Plain C++
// but for its SFU ops (a reciprocal, unit_sfu's ex2): tests/cpu/test_softcap.cpp measures it.
#pragma once

#include "common/exp2_poly.cuh"
#include "common/host_device.cuh"
#include "common/params.cuh"
#if defined(__CUDA_ARCH__)
#include "common/fast_math.cuh"
#endif

namespace flashjit {

// x -> softcap · tanh(x · softcap_scale) for one launch's FmhaParams, as
// softcap · (1 - 2 / (e + 1)) with e = e^(2 x softcap_scale) from exp2_poly: within 2e-6 · softcap
// of it. With ex2 for e a score took three SFU ops, the softmax's own included, and at 16 a clock
// per SM (to the FMA pipe's 128) the Hopper kernel was SFU-bound: 1.8x plain attention.
// tanh.approx.f32, one SFU op, is off by up to 5e-4 relative: times a cap of 30-50 that is
// 0.015-0.025 in a logit, past the LSE bound the tests hold kernels to.
struct SoftCap {
  // e = 2^y with y = 2 log2(e) · x · softcap_scale, saturated to [-28, 36] as 64 u - 28: there
  // tanh is +-1 in float (2^-28 + 1 rounds to 1, 2^36 + 1 to 2^36), so huge logits give
  // +softcap exactly and -softcap within 2 ulps; a NaN gives -softcap (unit_sfu: NaN). 28, not 32:
  // y near 0, where tanh is steepest, falls below u = 1/2, where u is twice as fine.
  static constexpr int kRange = 64, kOffset = 28;
  float unit_scale;  // 2 log2(e) · softcap_scale / 64: u = x · unit_scale + 28 / 64
  float cap;

  FLASHJIT_HOST_DEVICE explicit SoftCap(const FmhaParams& p)
      : unit_scale(2.f * kLog2e / kRange * p.softcap_scale), cap(p.softcap) {}

  // The capped score as softcap + slope() · unit(x): unit(x) = -1 / ((e + 1) kExp2PolyScale), in
  // [-1 / kExp2PolyScale, 0], from one SFU op and exp2_poly's scaled e.
  FLASHJIT_HOST_DEVICE float unit(float x) const {
    const float u = saturate(fmaf(x, unit_scale, static_cast<float>(kOffset) / kRange));
    return reciprocal(-exp2_poly<kRange, kOffset>(u) - kExp2PolyScale);
  }
#if defined(__CUDA_ARCH__)
  // unit(x) through ex2 on the SFU: 7 instructions fewer for one SFU op more (ex2 saturates by
  // itself: e = inf or 0 is unit 0 or -1 / kExp2PolyScale).
  __device__ __forceinline__ float unit_sfu(float x) const {
    return reciprocal(-exp2_ftz(fmaf(x, kRange * unit_scale, kLog2Exp2PolyScale)) - kExp2PolyScale);
  }
#endif
  FLASHJIT_HOST_DEVICE float slope() const { return 2.f * kExp2PolyScale * cap; }
  // The capped score of a unit (unit, unit_sfu; -inf stays -inf).
  FLASHJIT_HOST_DEVICE float score(float unit) const { return multiply(unit, slope()) + cap; }

  // Kernels: rcp.approx (MUFU.RCP, within an ulp of 1 / x); the host: 1 / x.
  FLASHJIT_HOST_DEVICE static float reciprocal(float x) {
#if defined(__CUDA_ARCH__)
    return rcp_approx_ftz(x);
#else
    return 1.f / x;
#endif
  }
  // x clamped to [0, 1] (NaN to 0), which FFMA.SAT does for free.
  FLASHJIT_HOST_DEVICE static float saturate(float x) {
#if defined(__CUDA_ARCH__)
    return __saturatef(x);
#else
    return fminf(fmaxf(x, 0.f), 1.f);
#endif
  }
  // A product the compiler may not contract into an FFMA.
  FLASHJIT_HOST_DEVICE static float multiply(float a, float b) {
#if defined(__CUDA_ARCH__)
    return __fmul_rn(a, b);
#else
    return a * b;
#endif
  }
};

#if defined(__CUDACC_RTC__) || defined(__CUDACC__)
// tanh(x) = 1 - 2 / (e^(2x) + 1) through ex2 and rcp: within ~1e-6 of tanh in absolute terms.
// The kernels but Hopper's keep it: none of them is SFU-bound (decode reads memory), and SoftCap
// cost them 5 instructions a score and registers (decode_tma m16n128 causal: 128 -> 163), where
// this takes softcap and softcap_scale straight from the constant bank.
__device__ __forceinline__ float tanh_accurate(float x) {
  constexpr float kTwoLog2e = 2.8853900817779268f;
  return 1.f - 2.f * rcp_approx_ftz(exp2_ftz(x * kTwoLog2e) + 1.f);
}

// Raw scores q·k of any float array (nested ones included) become softcap * tanh(q·k *
// softcap_scale), already scaled (params.cuh). Before masking: a masked -inf must stay -inf.
template <bool Softcap, typename Scores>
__device__ __forceinline__ void soft_cap(Scores& scores, const FmhaParams& p) {
  if constexpr (Softcap) {
    float* s = reinterpret_cast<float*>(&scores);
#pragma unroll
    for (int i = 0; i < static_cast<int>(sizeof(Scores) / sizeof(float)); ++i)
      s[i] = p.softcap * tanh_accurate(s[i] * p.softcap_scale);
  }
}

// The same scores left as SoftCap::unit: a softmax that scales them by capped.slope() more and
// takes its row max back (capped.score) computes the same, and no score pays for the
// multiply-add to softcap's units (the Hopper kernel: 2 of 13 instructions a score). Every
// SfuEvery-th score (none for 0) takes unit_sfu, to balance the SFU against instruction issue.
template <int SfuEvery, int N>
__device__ __forceinline__ void soft_cap_units(float (&s)[N], const SoftCap& capped) {
#pragma unroll
  for (int e = 0; e < N; ++e)
    s[e] = SfuEvery > 0 && e % SfuEvery == SfuEvery - 1 ? capped.unit_sfu(s[e]) : capped.unit(s[e]);
}
#endif

}  // namespace flashjit

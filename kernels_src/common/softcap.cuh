// Logit soft-capping (Gemma 2, Grok) for the variants built with it (Variant::softcap): a raw
// score x = q·k becomes softcap · tanh(x · softcap_scale), already scaled (params.cuh), before
// any mask (a masked -inf must stay -inf).
#pragma once

#include "common/fast_math.cuh"
#include "common/params.cuh"

namespace flashjit {

// tanh(x) = 1 - 2 / (e^(2x) + 1) through ex2 and rcp: within ~1e-6 of tanh in absolute terms.
// The kernels but Hopper's keep it: none of them is SFU-bound (decode reads memory), and the
// backward's gradient (1 - tanh^2) wants it.
__device__ __forceinline__ float tanh_accurate(float x) {
  constexpr float kTwoLog2e = 2.8853900817779268f;
  return 1.f - 2.f * rcp_approx_ftz(exp2_ftz(x * kTwoLog2e) + 1.f);
}

// Raw scores q·k of any float array (nested ones included) become softcap * tanh(q·k *
// softcap_scale). Accurate: tanh_accurate; else tanh_approx (the Hopper forward, below).
template <bool Softcap, bool Accurate = true, typename Scores>
__device__ __forceinline__ void soft_cap(Scores& scores, const FmhaParams& p) {
  if constexpr (Softcap) {
    float* s = reinterpret_cast<float*>(&scores);
#pragma unroll
    for (int i = 0; i < static_cast<int>(sizeof(Scores) / sizeof(float)); ++i) {
      const float x = s[i] * p.softcap_scale;
      s[i] = p.softcap * (Accurate ? tanh_accurate(x) : tanh_approx(x));
    }
  }
}

// The Hopper forward's capped scores, left as tanh(q·k · softcap_scale): a softmax that scales
// them by softcap more and takes its row max back (times softcap) computes the same. One SFU op
// a score, tanh.approx.f32 (relative error 2^-11: a capped logit s off by at most 4.9e-4 |s|,
// FlashAttention 2-4's choice too): with tanh from ex2 and rcp, three SFU ops a score with the
// softmax's own at 16 a clock per SM made softcap 1.81-1.88x plain attention; this, 1.33-1.44x
// (H100, two calls, 32k causal d128, softcap 30, docs/perf-log.md session 31).
template <int N>
__device__ __forceinline__ void soft_cap_tanh_units(float (&s)[N], const FmhaParams& p) {
#pragma unroll
  for (int e = 0; e < N; ++e) s[e] = tanh_approx(s[e] * p.softcap_scale);
}

}  // namespace flashjit

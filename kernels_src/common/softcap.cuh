// Logit soft-capping (Gemma 2, Grok) for the variants built with it (Variant::softcap).
#pragma once

#include "common/fast_math.cuh"
#include "common/params.cuh"

namespace flashjit {

// tanh(x) = 1 - 2 / (e^(2x) + 1) through ex2 and rcp: within ~1e-6 of tanh in absolute terms.
// tanh.approx.f32 is off by up to 5e-4 relative; times a cap of 30-50 that is 0.015-0.025 in a
// logit, past the LSE bound the tests hold kernels to. Saturates to +-1 for large |x|.
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

}  // namespace flashjit

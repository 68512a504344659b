// A kernel's user functions (Variant::user_functions, ForwardOptions::user_functions). Variants
// without them compile this file, which has none; those with them compile, in its place, the text
// src/jit/user_source.cpp makes of the caller's score_mod, mask_mod and score_mod_grad (the
// same names, then kScoreMod / kMaskMod / kScoreModGrad true). Kernels test the flags with
// `if constexpr`, so a kernel without user functions has no trace of them.
#pragma once

#include "common/params.cuh"

namespace flashjit::user {

constexpr bool kScoreMod = false;
constexpr bool kMaskMod = false;
constexpr bool kScoreModGrad = false;

__device__ __forceinline__ float score_mod(float score, int, int, int, int, const UserArgs&) {
  return score;
}
__device__ __forceinline__ bool mask_mod(int, int, int, int, const UserArgs&) { return true; }
// d score_mod / d score, for the backward.
__device__ __forceinline__ float score_mod_grad(float, int, int, int, int, const UserArgs&) {
  return 1.f;
}

}  // namespace flashjit::user

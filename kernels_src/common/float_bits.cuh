// A float's bit pattern and back, alike on the host (g++) and in kernels (NVRTC): for
// FLASHJIT_HOST_DEVICE math that builds floats from integer fields (common/exp2_poly.cuh).
#pragma once

#include "common/host_device.cuh"

namespace flashjit {

// Both compilers have C++20's bit_cast as a builtin (NVRTC without <bit>, at -std=c++17).
FLASHJIT_HOST_DEVICE constexpr unsigned float_bits(float x) {
  return __builtin_bit_cast(unsigned, x);
}
FLASHJIT_HOST_DEVICE constexpr float float_from_bits(unsigned bits) {
  return __builtin_bit_cast(float, bits);
}

}  // namespace flashjit

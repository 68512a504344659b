// bf16 / fp16 storage types and conversions through PTX, so kernels need no toolkit headers.
#pragma once

namespace flashjit {

struct bf16 { unsigned short bits; };
struct fp16 { unsigned short bits; };

__device__ __forceinline__ float to_float(float x) { return x; }
__device__ __forceinline__ float to_float(bf16 x) {
  return __uint_as_float(static_cast<unsigned>(x.bits) << 16);
}
__device__ __forceinline__ float to_float(fp16 x) {
  float f;
  asm("cvt.f32.f16 %0, %1;" : "=f"(f) : "h"(x.bits));
  return f;
}

template <typename T> __device__ __forceinline__ T from_float(float f);
template <> __device__ __forceinline__ bf16 from_float<bf16>(float f) {
  bf16 r;
  asm("cvt.rn.bf16.f32 %0, %1;" : "=h"(r.bits) : "f"(f));
  return r;
}
template <> __device__ __forceinline__ fp16 from_float<fp16>(float f) {
  fp16 r;
  asm("cvt.rn.f16.f32 %0, %1;" : "=h"(r.bits) : "f"(f));
  return r;
}

// Two floats packed into one 32-bit register of two 16-bit values (low half = first).
template <typename T> __device__ __forceinline__ unsigned pack2(float lo, float hi);
template <> __device__ __forceinline__ unsigned pack2<bf16>(float lo, float hi) {
  unsigned r;
  asm("cvt.rn.bf16x2.f32 %0, %1, %2;" : "=r"(r) : "f"(hi), "f"(lo));
  return r;
}
template <> __device__ __forceinline__ unsigned pack2<fp16>(float lo, float hi) {
  unsigned r;
  asm("cvt.rn.f16x2.f32 %0, %1, %2;" : "=r"(r) : "f"(hi), "f"(lo));
  return r;
}

// The two 16-bit values of a packed register as floats.
template <typename T> __device__ __forceinline__ void unpack2(unsigned packed, float& lo, float& hi) {
  T a{static_cast<unsigned short>(packed & 0xffffu)};
  T b{static_cast<unsigned short>(packed >> 16)};
  lo = to_float(a);
  hi = to_float(b);
}

}  // namespace flashjit

// 16-byte stores to global memory, spelled out in PTX: a uint4 copy was emitted as four STG.E.
#pragma once

namespace flashjit {

// Stores 4 words at `dst` (16-byte aligned, in global memory) if `enabled`. The predicate sits on
// the store itself: with `if (enabled)` around it, ptxas branched around each store (head_dim
// 256) and then guarded the shuffles after it with divergence checks.
__device__ __forceinline__ void store_global_16(void* dst, const unsigned (&w)[4], bool enabled) {
  asm volatile(
      "{\n.reg .pred p;\nsetp.ne.b32 p, %5, 0;\n"
      "@p st.global.v4.b32 [%0], {%1, %2, %3, %4};\n}" ::"l"(dst),
      "r"(w[0]), "r"(w[1]), "r"(w[2]), "r"(w[3]), "r"(static_cast<int>(enabled))
      : "memory");
}

}  // namespace flashjit

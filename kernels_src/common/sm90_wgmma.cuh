// wgmma (sm_90a): warpgroup-wide asynchronous matrix multiply-accumulate on the tensor cores,
// shared-memory matrix descriptors, and the fences and waits that order it. A warpgroup (4 warps)
// computes a 64 x N fp32 tile; accumulator element e of a thread sits at row
// 16 * warp + lane / 4 + 8 * ((e / 2) % 2) and column 8 * (e / 4) + 2 * (lane % 4) + e % 2.
#pragma once

#include "common/types.cuh"

namespace flashjit {

// Shared-memory descriptor of an operand laid out as TMA's SWIZZLE_128B writes it: rows of 128
// bytes, 16-byte chunks XOR-permuted within each 8-row (1024-byte) atom. Atoms must be 1024-byte
// aligned; `leading` / `stride` are the byte offsets between 64-element column blocks and between
// 8-row groups (PTX ISA "matrix descriptor"; swizzle mode 1 = 128B sits in bits 62-63).
__device__ __forceinline__ unsigned long long smem_desc_sw128(unsigned smem_addr, unsigned leading,
                                                              unsigned stride) {
  return static_cast<unsigned long long>((smem_addr & 0x3ffffu) >> 4) |
         static_cast<unsigned long long>(leading >> 4) << 16 |
         static_cast<unsigned long long>(stride >> 4) << 32 | 1ull << 62;
}

// The same for an operand in 32-byte-swizzled rows (a k16 slice of 16-bit elements a row): 8-row
// atoms of 256 bytes.
__device__ __forceinline__ unsigned long long smem_desc_sw32(unsigned smem_addr) {
  return static_cast<unsigned long long>((smem_addr & 0x3ffffu) >> 4) | 1ull << 16 |
         static_cast<unsigned long long>(256 >> 4) << 32 | 3ull << 62;
}

// The descriptor of the same operand `bytes` further on (a multiple of 16): the start address is
// the low 14 bits in 16-byte units and shared memory ends below 2^18 bytes, so the add never
// carries into the other fields. Descriptors built once per tile and advanced by constants cost
// one add per wgmma instead of the masks and shifts of a fresh one.
__device__ __forceinline__ unsigned long long smem_desc_advance(unsigned long long desc,
                                                                unsigned bytes) {
  return desc + (bytes >> 4);
}

// Orders this thread's earlier register writes before the next wgmma reads them.
__device__ __forceinline__ void wgmma_fence() {
  asm volatile("wgmma.fence.sync.aligned;" ::: "memory");
}

// Closes the wgmmas issued since the last commit into one group that can be waited on.
__device__ __forceinline__ void wgmma_commit() {
  asm volatile("wgmma.commit_group.sync.aligned;" ::: "memory");
}

// Waits until at most Pending committed groups are still in flight.
template <int Pending>
__device__ __forceinline__ void wgmma_wait() {
  asm volatile("wgmma.wait_group.sync.aligned %0;" ::"n"(Pending) : "memory");
}

// Compiler-only fence on a register an in-flight wgmma may write or read: no access to it moves
// across this point (the asm claims to change it).
__device__ __forceinline__ void wgmma_fence_operand(float& r) {
  asm volatile("" : "+f"(r)::"memory");
}
__device__ __forceinline__ void wgmma_fence_operand(unsigned& r) {
  asm volatile("" : "+r"(r)::"memory");
}
template <typename R, int N>
__device__ __forceinline__ void wgmma_fence_operands(R (&regs)[N]) {
#pragma unroll
  for (int i = 0; i < N; ++i) wgmma_fence_operand(regs[i]);
}
template <int N>
__device__ __forceinline__ void wgmma_fence_operands(unsigned (&fragments)[N][4]) {
#pragma unroll
  for (int i = 0; i < N; ++i) wgmma_fence_operands(fragments[i]);
}

// Inline PTX needs literal operand lists: the accumulators are operands %0 .. %(8G - 1) of a wgmma
// with G groups of 8 (N = 16 G), and its inputs follow them.
#define FLASHJIT_WGMMA_ACC_1 "%0, %1, %2, %3, %4, %5, %6, %7"
#define FLASHJIT_WGMMA_ACC_2 FLASHJIT_WGMMA_ACC_1 ", %8, %9, %10, %11, %12, %13, %14, %15"
#define FLASHJIT_WGMMA_ACC_3 FLASHJIT_WGMMA_ACC_2 ", %16, %17, %18, %19, %20, %21, %22, %23"
#define FLASHJIT_WGMMA_ACC_4 FLASHJIT_WGMMA_ACC_3 ", %24, %25, %26, %27, %28, %29, %30, %31"
#define FLASHJIT_WGMMA_ACC_5 FLASHJIT_WGMMA_ACC_4 ", %32, %33, %34, %35, %36, %37, %38, %39"
#define FLASHJIT_WGMMA_ACC_6 FLASHJIT_WGMMA_ACC_5 ", %40, %41, %42, %43, %44, %45, %46, %47"
#define FLASHJIT_WGMMA_ACC_7 FLASHJIT_WGMMA_ACC_6 ", %48, %49, %50, %51, %52, %53, %54, %55"
#define FLASHJIT_WGMMA_ACC_8 FLASHJIT_WGMMA_ACC_7 ", %56, %57, %58, %59, %60, %61, %62, %63"
#define FLASHJIT_WGMMA_ACC_9 FLASHJIT_WGMMA_ACC_8 ", %64, %65, %66, %67, %68, %69, %70, %71"
#define FLASHJIT_WGMMA_ACC_10 FLASHJIT_WGMMA_ACC_9 ", %72, %73, %74, %75, %76, %77, %78, %79"
#define FLASHJIT_WGMMA_ACC_11 FLASHJIT_WGMMA_ACC_10 ", %80, %81, %82, %83, %84, %85, %86, %87"
#define FLASHJIT_WGMMA_ACC_12 FLASHJIT_WGMMA_ACC_11 ", %88, %89, %90, %91, %92, %93, %94, %95"
#define FLASHJIT_WGMMA_ACC_13 FLASHJIT_WGMMA_ACC_12 ", %96, %97, %98, %99, %100, %101, %102, %103"
#define FLASHJIT_WGMMA_ACC_14 \
  FLASHJIT_WGMMA_ACC_13 ", %104, %105, %106, %107, %108, %109, %110, %111"
#define FLASHJIT_WGMMA_ACC_15 \
  FLASHJIT_WGMMA_ACC_14 ", %112, %113, %114, %115, %116, %117, %118, %119"
#define FLASHJIT_WGMMA_ACC_16 \
  FLASHJIT_WGMMA_ACC_15 ", %120, %121, %122, %123, %124, %125, %126, %127"
#define FLASHJIT_WGMMA_SS_1 "%8, %9"
#define FLASHJIT_WGMMA_SS_2 "%16, %17"
#define FLASHJIT_WGMMA_SS_3 "%24, %25"
#define FLASHJIT_WGMMA_SS_4 "%32, %33"
#define FLASHJIT_WGMMA_SS_5 "%40, %41"
#define FLASHJIT_WGMMA_SS_6 "%48, %49"
#define FLASHJIT_WGMMA_SS_7 "%56, %57"
#define FLASHJIT_WGMMA_SS_8 "%64, %65"
#define FLASHJIT_WGMMA_SS_9 "%72, %73"
#define FLASHJIT_WGMMA_SS_10 "%80, %81"
#define FLASHJIT_WGMMA_SS_11 "%88, %89"
#define FLASHJIT_WGMMA_SS_12 "%96, %97"
#define FLASHJIT_WGMMA_SS_13 "%104, %105"
#define FLASHJIT_WGMMA_SS_14 "%112, %113"
#define FLASHJIT_WGMMA_SS_15 "%120, %121"
#define FLASHJIT_WGMMA_SS_16 "%128, %129"
#define FLASHJIT_WGMMA_RS_1 "{%8, %9, %10, %11}, %12"
#define FLASHJIT_WGMMA_RS_2 "{%16, %17, %18, %19}, %20"
#define FLASHJIT_WGMMA_RS_3 "{%24, %25, %26, %27}, %28"
#define FLASHJIT_WGMMA_RS_4 "{%32, %33, %34, %35}, %36"
#define FLASHJIT_WGMMA_RS_5 "{%40, %41, %42, %43}, %44"
#define FLASHJIT_WGMMA_RS_6 "{%48, %49, %50, %51}, %52"
#define FLASHJIT_WGMMA_RS_7 "{%56, %57, %58, %59}, %60"
#define FLASHJIT_WGMMA_RS_8 "{%64, %65, %66, %67}, %68"
#define FLASHJIT_WGMMA_RS_9 "{%72, %73, %74, %75}, %76"
#define FLASHJIT_WGMMA_RS_10 "{%80, %81, %82, %83}, %84"
#define FLASHJIT_WGMMA_RS_11 "{%88, %89, %90, %91}, %92"
#define FLASHJIT_WGMMA_RS_12 "{%96, %97, %98, %99}, %100"
#define FLASHJIT_WGMMA_RS_13 "{%104, %105, %106, %107}, %108"
#define FLASHJIT_WGMMA_RS_14 "{%112, %113, %114, %115}, %116"
#define FLASHJIT_WGMMA_RS_15 "{%120, %121, %122, %123}, %124"
#define FLASHJIT_WGMMA_RS_16 "{%128, %129, %130, %131}, %132"
#define FLASHJIT_WGMMA_OUT_1(d) FLASHJIT_WGMMA_OUT8(d, 0)
#define FLASHJIT_WGMMA_OUT_2(d) FLASHJIT_WGMMA_OUT_1(d), FLASHJIT_WGMMA_OUT8(d, 8)
#define FLASHJIT_WGMMA_OUT_3(d) FLASHJIT_WGMMA_OUT_2(d), FLASHJIT_WGMMA_OUT8(d, 16)
#define FLASHJIT_WGMMA_OUT_4(d) FLASHJIT_WGMMA_OUT_3(d), FLASHJIT_WGMMA_OUT8(d, 24)
#define FLASHJIT_WGMMA_OUT_5(d) FLASHJIT_WGMMA_OUT_4(d), FLASHJIT_WGMMA_OUT8(d, 32)
#define FLASHJIT_WGMMA_OUT_6(d) FLASHJIT_WGMMA_OUT_5(d), FLASHJIT_WGMMA_OUT8(d, 40)
#define FLASHJIT_WGMMA_OUT_7(d) FLASHJIT_WGMMA_OUT_6(d), FLASHJIT_WGMMA_OUT8(d, 48)
#define FLASHJIT_WGMMA_OUT_8(d) FLASHJIT_WGMMA_OUT_7(d), FLASHJIT_WGMMA_OUT8(d, 56)
#define FLASHJIT_WGMMA_OUT_9(d) FLASHJIT_WGMMA_OUT_8(d), FLASHJIT_WGMMA_OUT8(d, 64)
#define FLASHJIT_WGMMA_OUT_10(d) FLASHJIT_WGMMA_OUT_9(d), FLASHJIT_WGMMA_OUT8(d, 72)
#define FLASHJIT_WGMMA_OUT_11(d) FLASHJIT_WGMMA_OUT_10(d), FLASHJIT_WGMMA_OUT8(d, 80)
#define FLASHJIT_WGMMA_OUT_12(d) FLASHJIT_WGMMA_OUT_11(d), FLASHJIT_WGMMA_OUT8(d, 88)
#define FLASHJIT_WGMMA_OUT_13(d) FLASHJIT_WGMMA_OUT_12(d), FLASHJIT_WGMMA_OUT8(d, 96)
#define FLASHJIT_WGMMA_OUT_14(d) FLASHJIT_WGMMA_OUT_13(d), FLASHJIT_WGMMA_OUT8(d, 104)
#define FLASHJIT_WGMMA_OUT_15(d) FLASHJIT_WGMMA_OUT_14(d), FLASHJIT_WGMMA_OUT8(d, 112)
#define FLASHJIT_WGMMA_OUT_16(d) FLASHJIT_WGMMA_OUT_15(d), FLASHJIT_WGMMA_OUT8(d, 120)
#define FLASHJIT_WGMMA_OUT8(d, i)                                                          \
  "+f"(d[i]), "+f"(d[i + 1]), "+f"(d[i + 2]), "+f"(d[i + 3]), "+f"(d[i + 4]), "+f"(d[i + 5]), \
      "+f"(d[i + 6]), "+f"(d[i + 7])

// D (+)= A·B, A (64 x 16) K-major and B (16 x N) K-major (TRANS_B 0: S = Q·Kᵀ) or N-major
// (TRANS_B 1: dQ = dS·K), both in shared memory.
#define FLASHJIT_WGMMA_SS(G, N, TYPE, SCALE_D, TRANS_B)                                        \
  asm volatile("{\n.reg .pred p;\nsetp.ne.b32 p, " #SCALE_D ", 0;\n"                           \
               "wgmma.mma_async.sync.aligned.m64n" #N "k16.f32." TYPE "." TYPE                 \
               " {" FLASHJIT_WGMMA_ACC_##G "}, " FLASHJIT_WGMMA_SS_##G ", p, 1, 1, 0, " #TRANS_B ";\n}" \
               : FLASHJIT_WGMMA_OUT_##G(d)                                                     \
               : "l"(desc_a), "l"(desc_b))
// D += A·B, A from registers, B (16 x N) N-major in shared memory (O += P·V).
#define FLASHJIT_WGMMA_RS_TNSP_B(G, N, TYPE)                                                   \
  asm volatile("{\n.reg .pred p;\nsetp.ne.b32 p, 1, 0;\n"                                      \
               "wgmma.mma_async.sync.aligned.m64n" #N "k16.f32." TYPE "." TYPE                 \
               " {" FLASHJIT_WGMMA_ACC_##G "}, " FLASHJIT_WGMMA_RS_##G ", p, 1, 1, 1;\n}"      \
               : FLASHJIT_WGMMA_OUT_##G(d)                                                     \
               : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "l"(desc_b))

#define FLASHJIT_WGMMA_SS_TYPES(G, N, TRANS_B)                                           \
  {                                                                                       \
    if constexpr (kBf16 && Accumulate) FLASHJIT_WGMMA_SS(G, N, "bf16", 1, TRANS_B);     \
    else if constexpr (kBf16) FLASHJIT_WGMMA_SS(G, N, "bf16", 0, TRANS_B);              \
    else if constexpr (Accumulate) FLASHJIT_WGMMA_SS(G, N, "f16", 1, TRANS_B);          \
    else FLASHJIT_WGMMA_SS(G, N, "f16", 0, TRANS_B);                                    \
  }
#define FLASHJIT_WGMMA_SS_CASE(G, N)                                              \
  else if constexpr (kN == N) {                                                   \
    if constexpr (TransposeB) FLASHJIT_WGMMA_SS_TYPES(G, N, 1)                     \
    else FLASHJIT_WGMMA_SS_TYPES(G, N, 0)                                          \
  }
#define FLASHJIT_WGMMA_RS_CASE(G, N)                                              \
  else if constexpr (kN == N) {                                                   \
    if constexpr (kBf16) FLASHJIT_WGMMA_RS_TNSP_B(G, N, "bf16");                  \
    else FLASHJIT_WGMMA_RS_TNSP_B(G, N, "f16");                                   \
  }
#define FLASHJIT_WGMMA_ALL_N(CASE)                                                        \
  CASE(1, 16) CASE(2, 32) CASE(3, 48) CASE(4, 64) CASE(5, 80) CASE(6, 96) CASE(7, 112)    \
  CASE(8, 128) CASE(9, 144) CASE(10, 160) CASE(11, 176) CASE(12, 192) CASE(13, 208)       \
  CASE(14, 224) CASE(15, 240) CASE(16, 256)

template <typename T> constexpr bool kIsBf16 = false;
template <> constexpr bool kIsBf16<bf16> = true;

// Issues d (+)= A·B for one k16 slice, both operands in 128B-swizzled shared memory: A = 64 x 16
// K-major (rows of Q, of dS), B = N x 16 K-major (keys of K in S = Q·Kᵀ), or with TransposeB
// 16 x N stored N-major (rows of B are the K index, N contiguous, as K's keys in dQ = dS·K).
// Accumulate = false overwrites d (the first slice of a tile).
template <typename T, int kN, bool Accumulate, bool TransposeB = false>
__device__ __forceinline__ void wgmma_ss(float (&d)[kN / 2], unsigned long long desc_a,
                                         unsigned long long desc_b) {
  static_assert(kN % 16 == 0 && kN >= 16 && kN <= 256, "wgmma N: a multiple of 16 up to 256");
  constexpr bool kBf16 = kIsBf16<T>;
  if constexpr (false) {
  }
  FLASHJIT_WGMMA_ALL_N(FLASHJIT_WGMMA_SS_CASE)
}

// Issues d += A·B for one k16 slice: A = the 64 x 16 slice of P in registers (four packed pairs
// per thread: rows r and r + 8, columns c and c + 8), B = 16 keys x N head dims of V stored N-major
// (rows of V are keys, head dims contiguous), hence the transposed-B flag.
template <typename T, int kN>
__device__ __forceinline__ void wgmma_rs_tnsp_b(float (&d)[kN / 2], const unsigned (&a)[4],
                                                unsigned long long desc_b) {
  static_assert(kN % 16 == 0 && kN >= 16 && kN <= 256, "wgmma N: a multiple of 16 up to 256");
  constexpr bool kBf16 = kIsBf16<T>;
  if constexpr (false) {
  }
  FLASHJIT_WGMMA_ALL_N(FLASHJIT_WGMMA_RS_CASE)
}

}  // namespace flashjit

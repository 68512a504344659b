// TMA tensor maps over the attention tensors, shared by the families that load with TMA (wgmma,
// decode on Hopper).
#pragma once

#include <cuda.h>

#include <cstdint>

#include "cuda/launch.hpp"
#include "flashjit/flashjit.hpp"

namespace flashjit::detail {

// Elements per box row: 128 bytes of 16-bit values, the span of the 128-byte swizzle.
constexpr int kTmaBoxWidth = 64;
// TMA strides must stay below 2^40 bytes.
constexpr std::int64_t kMaxTmaStride = std::int64_t{1} << 40;

// A rank-4 TMA map [head_dim, seqlen, heads, batch] over a tensor's real strides (in elements),
// moving boxes of 64 x box_rows to or from 128-byte-swizzled shared memory. Every dimension is
// bounded: loads read rows past seqlen as zeros, stores skip them. A paged cache maps as
// [head_dim, page_size, heads, num_pages]. `promotion`: how much L2 fetches per miss (prefill
// re-reads its K/V tiles and likes 256 bytes; decode streams them once and is 6 % faster with
// 128: docs/perf-log.md).
TensorMapArg tensor_map(MapOperand operand, const void* data, DType dtype, int head_dim, int seqlen,
                        int heads, int batch, std::int64_t stride_s, std::int64_t stride_h,
                        std::int64_t stride_b, int box_rows,
                        CUtensorMapL2promotion promotion = CU_TENSOR_MAP_L2_PROMOTION_L2_256B);

}  // namespace flashjit::detail

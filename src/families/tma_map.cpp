#include "families/tma_map.hpp"

#include "cuda/driver.hpp"

namespace flashjit::detail {

TensorMapArg tensor_map(MapOperand operand, const void* data, DType dtype, int head_dim, int seqlen,
                        int heads, int batch, std::int64_t stride_s, std::int64_t stride_h,
                        std::int64_t stride_b, int box_rows, CUtensorMapL2promotion promotion) {
  const cuuint64_t dims[4] = {static_cast<cuuint64_t>(head_dim), static_cast<cuuint64_t>(seqlen),
                              static_cast<cuuint64_t>(heads), static_cast<cuuint64_t>(batch)};
  const std::int64_t element_strides[3] = {stride_s, stride_h, stride_b};
  cuuint64_t strides[3];
  std::uint64_t packed = static_cast<std::uint64_t>(head_dim) * 2;  // bytes of a packed row
  for (int i = 0; i < 3; ++i) {
    // A size-1 dimension is never stepped along, and its stride may be anything (validate lets
    // it through); TMA still wants a multiple of 16, so give it the packed one.
    strides[i] =
        dims[i + 1] > 1 ? static_cast<cuuint64_t>(element_strides[i]) * 2 : (packed + 15) / 16 * 16;
    packed = strides[i] * dims[i + 1];
  }
  const cuuint32_t box[4] = {static_cast<cuuint32_t>(kTmaBoxWidth),
                             static_cast<cuuint32_t>(box_rows), 1, 1};
  const cuuint32_t steps[4] = {1, 1, 1, 1};
  TensorMapArg arg;
  arg.operand = operand;
  check(
      driver().cuTensorMapEncodeTiled(
          &arg.map,
          dtype == DType::bf16 ? CU_TENSOR_MAP_DATA_TYPE_BFLOAT16 : CU_TENSOR_MAP_DATA_TYPE_FLOAT16,
          4, const_cast<void*>(data), dims, strides, box, steps, CU_TENSOR_MAP_INTERLEAVE_NONE,
          CU_TENSOR_MAP_SWIZZLE_128B, promotion,
          CU_TENSOR_MAP_FLOAT_OOB_FILL_NONE),
      "cuTensorMapEncodeTiled");
  return arg;
}

}  // namespace flashjit::detail

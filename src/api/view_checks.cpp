#include "api/view_checks.hpp"

#include <fmt/format.h>
#include <fmt/ranges.h>

#include <algorithm>
#include <array>
#include <cstdint>
#include <limits>

namespace flashjit::detail {
namespace {

constexpr const char* kDims[4] = {"batch", "seqlen", "heads", "head_dim"};
constexpr std::int64_t kAlignBytes = 16;
constexpr std::int64_t kElementBytes = 2;  // bf16 and fp16

}  // namespace

[[noreturn]] void reject(const std::string& message) {
  throw Error(ErrorCode::invalid_argument, message);
}

void check_view(const char* name, const TensorView& t, DType dtype) {
  if (t.data == nullptr) reject(fmt::format("{}.data is null: expected a device pointer", name));
  if (t.dtype != dtype)
    reject(fmt::format("{}.dtype is {}, expected {} (the dtype of q)", name, to_string(t.dtype),
                       to_string(dtype)));
  for (int i = 0; i < 4; ++i) {
    if (t.shape[i] < 0 || t.shape[i] > std::numeric_limits<std::int32_t>::max())
      reject(fmt::format("{}.shape[{}] ({}) is {}: expected 0 <= size < 2^31", name, i, kDims[i],
                         t.shape[i]));
  }
  if (t.stride[3] != 1)
    reject(fmt::format("{}.stride[3] (head_dim) is {}: expected 1 (head_dim must be contiguous)",
                       name, t.stride[3]));
  if (reinterpret_cast<std::uintptr_t>(t.data) % kAlignBytes != 0)
    reject(fmt::format("{}.data ({}) is not 16-byte aligned", name, t.data));
  // No element is ever addressed: the strides of an empty tensor mean nothing (a contiguous one
  // with seqlen 0 has batch stride 0).
  if (std::find(t.shape.begin(), t.shape.end(), 0) != t.shape.end()) return;
  for (int i = 0; i < 3; ++i) {
    if (t.shape[i] <= 1) continue;  // a size-1 dimension is never stepped along
    if (t.stride[i] <= 0)
      reject(fmt::format("{}.stride[{}] ({}) is {}: expected a positive stride", name, i, kDims[i],
                         t.stride[i]));
    if (t.stride[i] % (kAlignBytes / kElementBytes) != 0)
      reject(fmt::format("{}.stride[{}] ({}) is {} elements: expected a multiple of 8 (16 bytes)",
                         name, i, kDims[i], t.stride[i]));
  }
  // Kernels address elements as sum(index * stride) in int64, then bytes: the last element's byte
  // offset must fit, or an absurd stride would wrap around to some other memory.
  std::int64_t last_element = 0, last_byte = 0;
  bool overflows = false;
  for (int i = 0; i < 3 && !overflows; ++i) {
    std::int64_t step = 0;
    overflows = __builtin_mul_overflow(t.shape[i] - 1, t.stride[i], &step) ||
                __builtin_add_overflow(last_element, step, &last_element);
  }
  overflows = overflows || __builtin_add_overflow(last_element, t.shape[3] - 1, &last_element) ||
              __builtin_mul_overflow(last_element, kElementBytes, &last_byte);
  if (overflows)
    reject(
        fmt::format("{}: shape {} with strides {} reaches past 2^63 bytes: expected the strides "
                    "of one tensor in memory",
                    name, fmt::join(t.shape, " x "), fmt::join(t.stride, ", ")));
}

void check_output_view(const char* name, const TensorView& t) {
  if (std::find(t.shape.begin(), t.shape.end(), 0) != t.shape.end()) return;  // nothing written
  std::array<int, 4> dims = {3, 0, 1, 2};  // head_dim first: its stride is 1
  std::sort(dims.begin() + 1, dims.end(), [&](int a, int b) { return t.stride[a] < t.stride[b]; });
  std::int64_t extent = t.shape[3];  // elements spanned by the dimensions so far (last offset + 1)
  for (int i = 1; i < 4; ++i) {
    const int dim = dims[i];
    if (t.shape[dim] <= 1) continue;  // never stepped along
    if (t.stride[dim] < extent)
      reject(fmt::format("{}: shape {} with strides {} has elements that share memory ({} stride "
                         "{} < {}, the extent of the dimensions inside it): expected an output "
                         "view with no overlap",
                         name, fmt::join(t.shape, " x "), fmt::join(t.stride, ", "), kDims[dim],
                         t.stride[dim], extent));
    // The span so far: check_view bounded the last offset, so this fits.
    extent += t.stride[dim] * (t.shape[dim] - 1);
  }
}

void expect_dim(const char* name, const TensorView& t, int dim, std::int64_t expected,
                const char* source) {
  if (t.shape[dim] != expected)
    reject(fmt::format("{}.shape[{}] ({}) is {}: expected {} ({})", name, dim, kDims[dim],
                       t.shape[dim], expected, source));
}

}  // namespace flashjit::detail

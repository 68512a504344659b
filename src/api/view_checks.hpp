// The checks every entry point makes of a TensorView (null data, dtype, sizes, strides,
// alignment) and of its sizes against another's, as Error(invalid_argument) naming the argument.
#pragma once

#include "flashjit/flashjit.hpp"

namespace flashjit::detail {

[[noreturn]] void reject(const std::string& message);
// `name`'s data, dtype (that of q), sizes (< 2^31), unit head_dim stride, 16-byte alignment of
// its data and strides, and that its last element's byte offset fits in int64.
void check_view(const char* name, const TensorView& t, DType dtype);
// An output (a view kernels write): no two of its elements share memory, i.e. its dimensions,
// ordered by stride, each step past the span of the ones before (as the strides of a contiguous,
// padded or transposed tensor do). Elements written twice by different CTAs would race.
// After check_view.
void check_output_view(const char* name, const TensorView& t);
// t.shape[dim] == expected, else an error saying where `expected` comes from (`source`).
void expect_dim(const char* name, const TensorView& t, int dim, std::int64_t expected,
                const char* source);

}  // namespace flashjit::detail

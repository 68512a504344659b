// Checks a forward call's arguments before anything is launched; produces the kernel params.
#pragma once

#include "flashjit/flashjit.hpp"
#include "core/problem.hpp"

namespace flashjit::detail {
// Throws Error(invalid_argument) naming the argument and the expected value.
ForwardProblem validate_forward(const TensorView& q, const TensorView& k, const TensorView& v,
                                const TensorView& out, const ForwardOptions& options);
}  // namespace flashjit::detail

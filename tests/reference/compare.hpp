// How far a forward output (and LSE) is from the float64 reference, and the pass bounds: one
// definition shared by `flashjit verify`, the GPU tests and the reliability tools.
#pragma once

#include <string>
#include <vector>

#include "reference.hpp"

namespace flashjit::test {

struct ForwardErrors {
  double max_abs_error = 0;
  double max_abs_reference = 0;  // scale of the expected output, for the abs bound
  double relative_l2_error = 0;  // ‖out − ref‖ / ‖ref‖
  double max_lse_error = 0;      // inf when a row that sees no key is not exactly -inf
  bool all_written = true;       // no poison (NaN/Inf) left in the output
};

// `out` uses the same view as the reference's inputs; `lse` may be null (not checked).
ForwardErrors compare_forward(const HostTensor& out, const std::vector<float>* lse,
                              const Reference& reference);

// Bounds: bf16 keeps 8 bits of mantissa and fp16 11, so the output's own rounding dominates;
// the abs bound scales with the output's magnitude (near one-hot rows return raw V values).
double relative_tolerance(DType dtype);
double max_abs_tolerance(DType dtype, double max_abs_reference = 1.0);
constexpr double kLseTolerance = 1e-2;

// Empty when every bound holds, else what failed ("max abs error 0.03 > 0.025; ...").
std::string describe_failures(const ForwardErrors& errors, DType dtype);

}  // namespace flashjit::test

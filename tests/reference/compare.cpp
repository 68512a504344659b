#include "compare.hpp"

#include <fmt/format.h>
#include <fmt/ranges.h>

#include <algorithm>
#include <cmath>

namespace flashjit::test {

ForwardErrors compare_forward(const HostTensor& out, const std::vector<float>* lse,
                              const Reference& reference) {
  const auto& shape = out.view.shape;
  ForwardErrors errors;
  double error_squares = 0, reference_squares = 0;
  std::size_t flat = 0;  // reference.out is contiguous [b, s, h, d]
  for (std::int64_t b = 0; b < shape[0]; ++b)
    for (std::int64_t s = 0; s < shape[1]; ++s)
      for (std::int64_t h = 0; h < shape[2]; ++h)
        for (std::int64_t d = 0; d < shape[3]; ++d, ++flat) {
          const double got = out.at(b, s, h, d);
          const double want = reference.out[flat];
          errors.max_abs_reference = std::max(errors.max_abs_reference, std::abs(want));
          if (!std::isfinite(got)) {
            errors.all_written = false;
            continue;
          }
          errors.max_abs_error = std::max(errors.max_abs_error, std::abs(got - want));
          error_squares += (got - want) * (got - want);
          reference_squares += want * want;
        }
  errors.relative_l2_error = reference_squares > 0 ? std::sqrt(error_squares / reference_squares)
                                                   : std::sqrt(error_squares);
  if (lse == nullptr) return errors;
  for (std::size_t i = 0; i < reference.lse.size(); ++i) {
    const double want = reference.lse[i];
    const double got = (*lse)[i];
    if (std::isinf(want)) {
      if (!(std::isinf(got) && got < 0)) errors.max_lse_error = INFINITY;  // must be exactly -inf
    } else if (!std::isfinite(got)) {
      errors.max_lse_error = INFINITY;
    } else {
      errors.max_lse_error = std::max(errors.max_lse_error, std::abs(got - want));
    }
  }
  return errors;
}

double relative_tolerance(DType dtype) { return dtype == DType::bf16 ? 1.2e-2 : 3e-3; }

double max_abs_tolerance(DType dtype, double max_abs_reference) {
  return (dtype == DType::bf16 ? 2.5e-2 : 5e-3) * std::max(1.0, max_abs_reference);
}

std::string describe_failures(const ForwardErrors& errors, DType dtype) {
  std::vector<std::string> problems;
  if (!errors.all_written) problems.push_back("output elements left unwritten or not finite");
  const double abs_bound = max_abs_tolerance(dtype, errors.max_abs_reference);
  if (errors.max_abs_error > abs_bound)
    problems.push_back(
        fmt::format("max abs error {:.3g} > {:.3g}", errors.max_abs_error, abs_bound));
  if (errors.relative_l2_error > relative_tolerance(dtype))
    problems.push_back(fmt::format("relative L2 error {:.3g} > {:.3g}", errors.relative_l2_error,
                                   relative_tolerance(dtype)));
  if (errors.max_lse_error > kLseTolerance)
    problems.push_back(
        fmt::format("LSE error {:.3g} > {:.3g}", errors.max_lse_error, kLseTolerance));
  return fmt::format("{}", fmt::join(problems, "; "));
}

}  // namespace flashjit::test

#include "compare_backward.hpp"

#include <fmt/format.h>
#include <fmt/ranges.h>

#include <algorithm>
#include <cmath>

namespace flashjit::test {
namespace {

// One gradient against its reference (contiguous [b, s, h, d]); masked_rows[s] marks the
// sequence positions whose rows must be exactly zero.
GradientError compare_gradient(const HostTensor& got, const std::vector<double>& want,
                               const std::vector<bool>& masked_rows, std::uint16_t poison) {
  const auto& shape = got.view.shape;
  GradientError e;
  std::size_t flat = 0;
  for (std::int64_t b = 0; b < shape[0]; ++b)
    for (std::int64_t s = 0; s < shape[1]; ++s)
      for (std::int64_t h = 0; h < shape[2]; ++h)
        for (std::int64_t d = 0; d < shape[3]; ++d, ++flat) {
          const std::uint16_t bits = got.bits[static_cast<std::size_t>(got.offset(b, s, h, d))];
          const double value = got.at(b, s, h, d);
          e.max_abs_reference = std::max(e.max_abs_reference, std::abs(want[flat]));
          if (bits == poison) ++e.poison_left;
          if (!std::isfinite(value)) {
            ++e.not_finite;
            continue;
          }
          if (masked_rows[static_cast<std::size_t>(s)] && value != 0.0) ++e.nonzero_where_masked;
          const double error = std::abs(value - want[flat]);
          if (error > e.max_abs_error) {
            e.max_abs_error = error;
            e.worst = {b, s, h, d};
            e.worst_got = value;
            e.worst_want = want[flat];
          }
        }
  e.relative_error =
      e.max_abs_reference > 0 ? e.max_abs_error / e.max_abs_reference : e.max_abs_error;
  return e;
}

}  // namespace

double gradient_tolerance(DType dtype) {
  return dtype == DType::bf16 ? kGradientToleranceBf16 : kGradientToleranceFp16;
}

GradientErrors compare_backward(const HostTensor& dq, const HostTensor& dk, const HostTensor& dv,
                                const ReferenceGradients& reference, std::uint16_t poison) {
  return {compare_gradient(dq, reference.dq, reference.query_sees_nothing, poison),
          compare_gradient(dk, reference.dk, reference.key_seen_by_none, poison),
          compare_gradient(dv, reference.dv, reference.key_seen_by_none, poison)};
}

std::string describe(const GradientErrors& errors) {
  auto one = [](const char* name, const GradientError& e) {
    return fmt::format("{} {:.2e} (at [{}]: {:.4g} vs {:.4g})", name, e.relative_error,
                       fmt::join(e.worst, ", "), e.worst_got, e.worst_want);
  };
  return fmt::format("{} {} {}", one("dq", errors.dq), one("dk", errors.dk), one("dv", errors.dv));
}

std::string describe_failures(const GradientErrors& errors, DType dtype) {
  std::vector<std::string> problems;
  auto check = [&](const char* name, const GradientError& e) {
    if (e.poison_left > 0)
      problems.push_back(
          fmt::format("{}: {} elements never written (poison left)", name, e.poison_left));
    if (e.not_finite > e.poison_left)
      problems.push_back(
          fmt::format("{}: {} NaN or inf elements", name, e.not_finite - e.poison_left));
    if (e.nonzero_where_masked > 0)
      problems.push_back(fmt::format("{}: {} elements not zero where the mask leaves nothing", name,
                                     e.nonzero_where_masked));
    if (e.relative_error > gradient_tolerance(dtype))
      problems.push_back(fmt::format(
          "{}: relative error {:.3g} > {:.3g} at [{}] ({:.4g} vs {:.4g})", name, e.relative_error,
          gradient_tolerance(dtype), fmt::join(e.worst, ", "), e.worst_got, e.worst_want));
  };
  check("dq", errors.dq);
  check("dk", errors.dk);
  check("dv", errors.dv);
  return fmt::format("{}", fmt::join(problems, "; "));
}

}  // namespace flashjit::test

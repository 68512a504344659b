// What the families that run on any GPU from sm_80 (simt, mma) share: one CTA per
// (query tile, head, batch), every valid problem, sm_80 features only.
#pragma once

#include <string>
#include <string_view>

#include "families/family.hpp"

namespace flashjit::detail {

LaunchPlan query_tile_plan(const Variant& variant, const ForwardProblem& problem, int threads,
                           int shared_bytes);
// unsupported_reason of a family that runs every valid problem.
std::string runs_every_problem(const ForwardProblem& problem);
// For kernels that need only sm_80 features (cp.async, mma.sync, bf16 conversions).
bool runs_on_sm80_or_later(std::string_view arch);

}  // namespace flashjit::detail

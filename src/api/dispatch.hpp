// Problem + device -> Variant: the fastest family that can run the problem on this arch, with
// that family's tile choice.
#pragma once

#include <optional>
#include <vector>

#include "core/problem.hpp"
#include "families/family.hpp"
#include "flashjit/flashjit.hpp"

namespace flashjit::detail {
// `forced`: only this family (nullptr: any). Throws Error(unsupported) when no family can (or the
// forced one cannot) run the problem, and Error(invalid_argument) when forced tiles do not fit
// the chosen family or the GPU.
Variant select_variant(const ForwardProblem& problem, const DeviceInfo& device,
                       const KernelFamily* forced, std::optional<TileConfig> forced_tiles = {});
// Every variant that can run the problem on this GPU, in order of preference: each family's
// table shape for it, then the family's other table shapes (what may already be compiled while
// the preferred one is not). Only the forced family's when one is forced.
std::vector<Variant> fallback_variants(const ForwardProblem& problem, const DeviceInfo& device,
                                       const KernelFamily* forced);
// The family a caller named in ForwardOptions::family (nullptr: none named). Throws
// Error(invalid_argument) for a name that is not a family.
const KernelFamily* forced_family(const std::optional<std::string>& name);
}  // namespace flashjit::detail

// Problem + device -> Variant: the fastest family that can run the problem on this arch, with
// that family's tile choice.
#pragma once

#include <optional>

#include "core/problem.hpp"
#include "families/family.hpp"
#include "flashjit/flashjit.hpp"

namespace flashjit::detail {
// `forced`: only this family (nullptr: any). Throws Error(unsupported) when no family can (or the
// forced one cannot) run the problem, and Error(invalid_argument) when forced tiles do not fit
// the chosen family or the GPU.
Variant select_variant(const ForwardProblem& problem, const DeviceInfo& device,
                       const KernelFamily* forced, std::optional<TileConfig> forced_tiles = {});
// The family a caller named in ForwardOptions::family (nullptr: none named). Throws
// Error(invalid_argument) for a name that is not a family.
const KernelFamily* forced_family(const std::optional<std::string>& name);
}

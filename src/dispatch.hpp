// Problem + device -> Variant: the fastest family that can run the problem on this arch, with
// that family's per-arch tile config.
#pragma once

#include <optional>

#include "flashjit/flashjit.hpp"
#include "problem.hpp"

namespace flashjit::detail {
// Throws Error(unsupported) when no family can (or the forced one cannot) run the problem, and
// Error(invalid_argument) when forced tiles do not fit the chosen family or the GPU.
Variant select_variant(const ForwardProblem& problem, const DeviceInfo& device,
                       std::optional<Family> forced, std::optional<TileConfig> forced_tiles = {});
}

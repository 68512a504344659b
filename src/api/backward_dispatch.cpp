// Which kernels a backward runs: the dK/dV family (forced or the first registered that runs the
// problem), the kernel that computes or finishes dQ after it, and so the workspace it needs.
#include <fmt/format.h>
#include <fmt/ranges.h>

#include <algorithm>
#include <string>
#include <vector>

#include "api/backward_kernels.hpp"
#include "core/user_functions.hpp"
#include "families/bwd_mma/bwd_mma.hpp"
#include "families/bwd_rows/bwd_rows.hpp"
#include "families/bwd_wgmma/bwd_wgmma.hpp"
#include "families/registry.hpp"

namespace flashjit::detail {
namespace {

// Empty when the dK/dV family runs the problem on `arch`, else why not.
std::string why_not(const KernelFamily& family, const BackwardProblem& problem,
                    std::string_view arch) {
  const int d = problem.forward.head_dim;
  if (family.role != FamilyRole::backward || !family.runs_on(arch) ||
      std::find(family.head_dims.begin(), family.head_dims.end(), d) == family.head_dims.end())
    return fmt::format("has no kernel for head_dim {} on {}", d, arch);
  if (family.always_accumulates_dq && problem.deterministic)
    return "adds dQ up with atomics: not deterministic (options.deterministic is set)";
  if (std::string missing = missing_feature(family, problem.forward); !missing.empty())
    return missing;
  return family.unsupported_reason ? family.unsupported_reason(problem.forward) : std::string();
}

bool runs(const KernelFamily& family, const BackwardProblem& problem, std::string_view arch) {
  return why_not(family, problem, arch).empty();
}

// The family's dK/dV variant for the problem: its masks, varlen, score variants and user
// functions (not the learnable sinks: the forward's LSE holds them).
Variant dkdv_variant(const KernelFamily& family, const BackwardProblem& problem,
                     std::string_view arch, TileConfig tiles) {
  const ForwardProblem& forward = problem.forward;
  return variant_of(family, arch, forward.dtype, forward.head_dim, forward.causal, tiles, false,
                    forward.varlen, forward.softcap > 0.f, forward.window, false, forward.alibi,
                    forward.user_functions);
}

std::vector<std::string_view> dkdv_family_names() {
  std::vector<std::string_view> names;
  for (const KernelFamily* family : registered_families())
    if (family->role == FamilyRole::backward) names.push_back(family->name);
  return names;
}

}  // namespace

BackwardKey backward_key(CUcontext context, const BackwardProblem& problem,
                         const BackwardOptions& options) {
  const TileConfig tiles = options.tiles.value_or(TileConfig{0, 0, 0});
  return {context,
          problem.forward.dtype,
          problem.forward.head_dim,
          problem.forward.causal,
          problem.forward.softcap > 0.f,
          problem.forward.window,
          problem.forward.alibi,
          problem.forward.varlen,
          user_functions_key(problem.forward.user_functions),
          problem.params.dsink != nullptr,
          problem.deterministic,
          options.family.value_or(std::string()),
          tiles.tile_m,
          tiles.tile_n,
          tiles.stages};
}

BackwardPlanKey BackwardPlanKey::of(CUcontext context, const BackwardProblem& problem,
                                    const BackwardOptions& options, const KernelFamily* forced) {
  BackwardPlanKey key;
  key.forward = PlanKey::of(context, problem.forward, forced, options.tiles);
  key.dout_strides = {problem.params.do_stride_b, problem.params.do_stride_s,
                      problem.params.do_stride_h};
  key.deterministic = problem.deterministic;
  key.d_sink = problem.params.dsink != nullptr;
  return key;
}

Variant select_backward_variant(const BackwardProblem& problem, const DeviceInfo& device,
                                const BackwardOptions& options) {
  const KernelFamily* chosen = nullptr;
  if (options.family) {
    const KernelFamily* family = find_family(*options.family);
    if (family == nullptr || family->role != FamilyRole::backward)
      throw Error(ErrorCode::invalid_argument,
                  fmt::format("options.family '{}' is not a backward dK/dV family: expected one "
                              "of {}",
                              *options.family, fmt::join(dkdv_family_names(), ", ")));
    if (const std::string why = why_not(*family, problem, device.arch); !why.empty())
      throw Error(ErrorCode::invalid_argument,
                  fmt::format("options.family {} {}", family->name, why));
    chosen = family;
  } else {
    // The first family that runs the problem, and with options.tiles the first that also builds
    // them (bwd_wgmma_fused takes only its own shapes; bwd_wgmma after it takes more); when none
    // builds them, the first one's reason is the error below.
    const KernelFamily* first = nullptr;
    for (const KernelFamily* family : registered_families()) {
      if (!runs(*family, problem, device.arch)) continue;
      if (first == nullptr) first = family;
      if (!options.tiles || family->check_tiles(dkdv_variant(*family, problem, device.arch,
                                                             *options.tiles))
                                .empty()) {
        chosen = family;
        break;
      }
    }
    if (chosen == nullptr) chosen = first;
    if (chosen == nullptr)
      throw Error(ErrorCode::unsupported,
                  fmt::format("no backward family runs head_dim {} on {}",
                              problem.forward.head_dim, device.arch));
  }
  const TileConfig tiles =
      options.tiles.value_or(chosen->tile_table(device.arch, problem.forward.head_dim,
                                                problem.forward.causal, false)
                                 .pick(problem.forward));
  const Variant variant = dkdv_variant(*chosen, problem, device.arch, tiles);
  check_variant(variant);
  return variant;
}

Variant backward_finish_variant(const BackwardProblem& problem, const Variant& dkdv) {
  if (family_named(dkdv.family, "family").always_accumulates_dq)
    return bwd_convert_variant(dkdv.arch, dkdv.dtype, dkdv.head_dim);
  if (dkdv.family == "bwd_wgmma") return bwd_wgmma_dq_variant(dkdv);
  if (!problem.deterministic)
    return bwd_convert_variant(dkdv.arch, dkdv.dtype, dkdv.head_dim);
  return bwd_mma_dq_variant(dkdv);
}

bool uses_dq_accumulator(const Variant& finish) {
  return family_named(finish.family, "family").role == FamilyRole::backward_rows;
}

LaunchPlan backward_launch_plan(const Variant& variant, const ForwardProblem& problem,
                                const BackwardParams& params, const DeviceInfo& device) {
  const KernelFamily& family = family_named(variant.family, "family");
  return family.backward_plan ? family.backward_plan(variant, problem, params, device)
                              : family.plan(variant, problem, device);
}

}  // namespace flashjit::detail

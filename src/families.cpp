#include "families.hpp"

#include <fmt/format.h>

#include <algorithm>

#include "arch.hpp"

namespace flashjit::detail {

extern const FamilyTraits kMmaFamily;
extern const FamilyTraits kSimtFamily;
extern const FamilyTraits kWgmmaFamily;

const std::vector<const FamilyTraits*>& all_families() {
  static const std::vector<const FamilyTraits*> families = {&kWgmmaFamily, &kMmaFamily,
                                                                  &kSimtFamily};
  return families;
}

const FamilyTraits& family_traits(Family family) {
  for (const FamilyTraits* traits : all_families())
    if (traits->family == family) return *traits;
  throw Error(ErrorCode::unsupported,
              fmt::format("kernel family '{}' is not built into this flashjit", to_string(family)));
}

std::optional<Family> family_from_name(std::string_view name) {
  for (Family f : {Family::simt, Family::mma, Family::wgmma})
    if (to_string(f) == name) return f;
  return std::nullopt;
}

std::string name_expression(const Variant& v) {
  return fmt::format("{}<flashjit::{}, {}, {}, {}, {}, {}>",
                     family_traits(v.family).kernel_template, to_string(v.dtype), v.head_dim,
                     v.tile_m, v.tile_n, v.stages, v.causal ? "true" : "false");
}

TileConfig TileTable::pick(int seqlen_k) const {
  for (int i = 0; i + 1 < count; ++i)
    if (seqlen_k <= rules[i].max_seqlen_k) return rules[i].tiles;
  return rules[count - 1].tiles;
}

void check_variant(const Variant& v) {
  const FamilyTraits& traits = family_traits(v.family);
  auto fail = [&](const std::string& what) {
    throw Error(ErrorCode::invalid_argument, fmt::format("variant {}: {}", v.name(), what));
  };
  if (!traits.runs_on(v.arch))
    fail(fmt::format("family {} does not run on {}", to_string(v.family), v.arch));
  const auto dims = supported_head_dims();
  if (std::find(dims.begin(), dims.end(), v.head_dim) == dims.end())
    fail(fmt::format("head_dim {} is not supported", v.head_dim));
  if (std::string problem = traits.check(v); !problem.empty()) fail(problem);
}

LaunchPlan query_tile_plan(const Variant& variant, const ForwardProblem& problem, int threads,
                           int shared_bytes) {
  LaunchPlan plan;
  plan.grid = {static_cast<unsigned>((problem.seqlen_q + variant.tile_m - 1) / variant.tile_m),
               static_cast<unsigned>(problem.heads_q), static_cast<unsigned>(problem.batch)};
  plan.block = {static_cast<unsigned>(threads), 1, 1};
  plan.shared_bytes = static_cast<unsigned>(shared_bytes);
  return plan;
}

std::string runs_every_problem(const ForwardProblem&) { return {}; }

bool runs_on_sm80_or_later(std::string_view arch) { return arch_number(arch) >= 80; }

}  // namespace flashjit::detail

#include "dispatch.hpp"

#include <fmt/format.h>

#include <algorithm>

#include "families.hpp"
#include "log.hpp"

namespace flashjit::detail {
namespace {

Variant variant_for(const FamilyTraits& traits, std::string_view arch, DType dtype, int head_dim,
                    bool causal) {
  const TileConfig tiles = traits.default_tiles(arch, head_dim, causal);
  return Variant{traits.family, std::string(arch), dtype,   head_dim,
                 tiles.tile_m,  tiles.tile_n,      tiles.stages, causal};
}

}  // namespace

Variant select_variant(const ForwardProblem& problem, const DeviceInfo& device,
                       std::optional<Family> forced) {
  std::string reasons;
  for (const FamilyTraits* traits : all_families()) {
    if (forced && traits->family != *forced) continue;
    std::string why;
    if (!traits->runs_on(device.arch)) {
      why = fmt::format("does not run on {}", device.arch);
    } else if (std::find(traits->head_dims.begin(), traits->head_dims.end(), problem.head_dim) ==
               traits->head_dims.end()) {
      why = fmt::format("has no head_dim {}", problem.head_dim);
    } else {
      why = traits->unsupported_reason(problem);
    }
    Variant variant;
    if (why.empty()) {
      variant = variant_for(*traits, device.arch, problem.dtype, problem.head_dim, problem.causal);
      const int smem = traits->shared_bytes(variant);
      if (smem > device.max_shared_per_block_optin)
        why = fmt::format("needs {} B of shared memory, the GPU allows {}", smem,
                          device.max_shared_per_block_optin);
    }
    if (why.empty()) return variant;
    log().debug("family {} skipped: {}", to_string(traits->family), why);
    reasons += fmt::format("{}{} {}", reasons.empty() ? "" : "; ", to_string(traits->family), why);
  }
  if (forced && reasons.empty()) reasons = fmt::format("{} is not built in", to_string(*forced));
  throw Error(ErrorCode::unsupported, fmt::format("no kernel family can run this problem on {}: {}",
                                                  device.arch, reasons));
}

}  // namespace flashjit::detail

namespace flashjit {

std::vector<Variant> default_variants(std::string_view arch_spelling) {
  const std::string arch = normalize_arch(arch_spelling);
  std::vector<Variant> variants;
  for (const detail::FamilyTraits* traits : detail::all_families()) {
    if (!traits->runs_on(arch)) continue;
    for (DType dtype : {DType::bf16, DType::fp16})
      for (int head_dim : traits->head_dims)
        for (bool causal : {false, true})
          variants.push_back(detail::variant_for(*traits, arch, dtype, head_dim, causal));
  }
  return variants;
}

}  // namespace flashjit

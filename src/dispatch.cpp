#include "dispatch.hpp"

#include <fmt/format.h>

#include <algorithm>

#include "families.hpp"
#include "log.hpp"

namespace flashjit::detail {
namespace {

Variant variant_for(const FamilyTraits& traits, std::string_view arch, DType dtype, int head_dim,
                    bool causal, TileConfig tiles) {
  return Variant{traits.family, std::string(arch), dtype,   head_dim,
                 tiles.tile_m,  tiles.tile_n,      tiles.stages, causal};
}

// Empty when the variant fits the GPU's shared memory, else what it needs and what the GPU allows.
std::string shared_memory_shortfall(const FamilyTraits& traits, const Variant& variant,
                                    const DeviceInfo& device) {
  const int smem = traits.shared_bytes(variant);
  if (smem <= device.max_shared_per_block_optin) return {};
  return fmt::format("needs {} B of shared memory, the GPU allows {}", smem,
                     device.max_shared_per_block_optin);
}

}  // namespace

Variant select_variant(const ForwardProblem& problem, const DeviceInfo& device,
                       std::optional<Family> forced, std::optional<TileConfig> forced_tiles) {
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
      const TileConfig tiles =
          forced_tiles ? *forced_tiles
                       : traits->tile_table(device.arch, problem.head_dim, problem.causal)
                             .pick(problem.seqlen_k);
      variant = variant_for(*traits, device.arch, problem.dtype, problem.head_dim, problem.causal,
                            tiles);
      if (forced_tiles) why = traits->check(variant);
      if (why.empty()) why = shared_memory_shortfall(*traits, variant, device);
      // A caller's tile shape the family cannot build is the caller's error, not a reason to fall
      // back to a slower family.
      if (forced_tiles && !why.empty())
        throw Error(ErrorCode::invalid_argument,
                    fmt::format("options.tiles (tile_m {}, tile_n {}, stages {}) for family {}: {}",
                                tiles.tile_m, tiles.tile_n, tiles.stages, to_string(traits->family),
                                why));
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
        for (bool causal : {false, true}) {
          // Every shape the table may pick, once each.
          const detail::TileTable table = traits->tile_table(arch, head_dim, causal);
          for (int i = 0; i < table.count; ++i) {
            const Variant v = detail::variant_for(*traits, arch, dtype, head_dim, causal,
                                                  table.rules[i].tiles);
            if (std::find(variants.begin(), variants.end(), v) == variants.end())
              variants.push_back(v);
          }
        }
  }
  return variants;
}

}  // namespace flashjit

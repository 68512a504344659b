#include "api/dispatch.hpp"

#include <fmt/format.h>

#include <algorithm>

#include "core/arch.hpp"
#include "core/log.hpp"
#include "families/registry.hpp"

namespace flashjit::detail {
namespace {

// Empty when the variant fits the GPU's shared memory, else what it needs and what the GPU allows.
std::string shared_memory_shortfall(const KernelFamily& family, const Variant& variant,
                                    const DeviceInfo& device) {
  const int smem = family.shared_bytes(variant);
  if (smem <= device.max_shared_per_block_optin) return {};
  return fmt::format("needs {} B of shared memory, the GPU allows {}", smem,
                     device.max_shared_per_block_optin);
}

}  // namespace

const KernelFamily* forced_family(const std::optional<std::string>& name) {
  if (!name) return nullptr;
  const KernelFamily& family = family_named(*name, "options.family");
  if (family.role != FamilyRole::attention)
    throw Error(ErrorCode::invalid_argument,
                fmt::format("options.family '{}' merges partial results: expected an attention "
                            "family",
                            *name));
  return &family;
}

std::vector<Variant> fallback_variants(const ForwardProblem& problem, const DeviceInfo& device,
                                       const KernelFamily* forced) {
  std::vector<Variant> candidates;
  for (const KernelFamily* family : registered_families()) {
    if ((forced && family != forced) ||
        !why_family_cannot_run(*family, problem, device.arch).empty())
      continue;
    const TileTable table =
        family->tile_table(device.arch, problem.head_dim, problem.causal, problem.paged);
    std::vector<TileConfig> shapes = {table.pick(problem)};
    for (int i = 0; i < table.count; ++i) shapes.push_back(table.rules[i].tiles);
    for (const TileConfig& tiles : shapes) {
      const Variant v =
          variant_of(*family, device.arch, problem.dtype, problem.head_dim, problem.causal, tiles,
                     problem.paged, problem.per_sequence_lengths(), problem.softcap > 0.f,
                     problem.window, problem.sink, problem.alibi, problem.user_functions);
      if (shared_memory_shortfall(*family, v, device).empty() &&
          std::find(candidates.begin(), candidates.end(), v) == candidates.end())
        candidates.push_back(v);
    }
  }
  return candidates;
}

Variant select_variant(const ForwardProblem& problem, const DeviceInfo& device,
                       const KernelFamily* forced, std::optional<TileConfig> forced_tiles) {
  std::string reasons;
  for (const KernelFamily* family : registered_families()) {
    if ((forced && family != forced) || family->role != FamilyRole::attention) continue;
    std::string why = why_family_cannot_run(*family, problem, device.arch);
    Variant variant;
    if (why.empty()) {
      const TileConfig tiles =
          forced_tiles
              ? *forced_tiles
              : family->tile_table(device.arch, problem.head_dim, problem.causal, problem.paged)
                    .pick(problem);
      variant = variant_of(*family, device.arch, problem.dtype, problem.head_dim, problem.causal,
                           tiles, problem.paged, problem.per_sequence_lengths(),
                           problem.softcap > 0.f, problem.window, problem.sink, problem.alibi, problem.user_functions);
      if (forced_tiles) why = family->check_tiles(variant);
      if (why.empty()) why = shared_memory_shortfall(*family, variant, device);
      // A caller's tile shape the family cannot build is the caller's error, not a reason to fall
      // back to a slower family.
      if (forced_tiles && !why.empty())
        throw Error(ErrorCode::invalid_argument,
                    fmt::format("options.tiles (tile_m {}, tile_n {}, stages {}) for family {}: {}",
                                tiles.tile_m, tiles.tile_n, tiles.stages, family->name, why));
    }
    if (why.empty()) return variant;
    log().debug("family {} skipped: {}", family->name, why);
    reasons += fmt::format("{}{} {}", reasons.empty() ? "" : "; ", family->name, why);
  }
  throw Error(ErrorCode::unsupported,
              fmt::format("no kernel family can run this problem on {}: {}", device.arch, reasons));
}

}  // namespace flashjit::detail

namespace flashjit {

std::vector<Variant> default_variants(std::string_view arch_spelling) {
  const std::string arch = normalize_arch(arch_spelling);
  std::vector<Variant> variants;
  for (const detail::KernelFamily* family : detail::registered_families()) {
    if (!family->runs_on(arch)) continue;
    // Block-mask builders exist only for user functions, which no default variant has.
    if (family->role == detail::FamilyRole::block_mask) continue;
    // The merge and the backward row passes take no mask.
    const bool maskless = family->role == detail::FamilyRole::merge ||
                          family->role == detail::FamilyRole::backward_rows;
    const bool can_page = (family->features & detail::kFeaturePagedKv) != 0;
    for (DType dtype : {DType::bf16, DType::fp16})
      for (int head_dim : family->head_dims)
        for (bool causal : {false, true})
          for (bool paged : {false, true})
            for (bool varlen : {false, true}) {
              if ((maskless && causal) || (paged && !can_page) || (varlen && !family->varlen_variants))
                continue;
              // Every shape the table may pick, once each.
              const detail::TileTable table = family->tile_table(arch, head_dim, causal, paged);
              for (int i = 0; i < table.count; ++i) {
                const Variant v = detail::variant_of(*family, arch, dtype, head_dim, causal,
                                                     table.rules[i].tiles, paged, varlen);
                // A shape too big for the arch's parts (decode d256 on 99 KB parts) is not built.
                if (family->shared_bytes(v) > detail::max_shared_bytes_per_block(arch)) continue;
                if (std::find(variants.begin(), variants.end(), v) == variants.end())
                  variants.push_back(v);
              }
            }
  }
  return variants;
}

}  // namespace flashjit

#include "families/merge/merge.hpp"

#include <fmt/format.h>

#include "families/query_tile.hpp"
#include "families/registry.hpp"
#include "merge/shape.cuh"

namespace flashjit::detail {
namespace {

// The one shape: tile_m = rows (warps) per CTA; tile_n and stages have no meaning here.
constexpr TileConfig kMergeTiles{MergeShape::kWarps, 1, 1};

std::string merge_check(const Variant& v) {
  if (TileConfig{v.tile_m, v.tile_n, v.stages} != kMergeTiles)
    return fmt::format("merge variants have tiles m{}n1s1 (one warp per row, {} rows per CTA)",
                       MergeShape::kWarps, MergeShape::kWarps);
  if (v.causal) return "merge variants have no mask: drop .causal";
  return {};
}

int merge_shared_bytes(const Variant&) { return 0; }

TileTable merge_tiles(std::string_view, int, bool, bool) { return TileTable::single(kMergeTiles); }

std::string merge_arguments(const Variant& v) {
  return fmt::format("{}, {}", v.head_dim, MergeShape::kWarps);
}

// Whole columns per lane.
constexpr int kMergeHeadDims[] = {32, 64, 96, 128, 192, 256};

}  // namespace

constinit extern const KernelFamily kMergeFamily = {
    .role = FamilyRole::merge,
    .features = 0,
    .name = "merge",
    .summary = "merges partial results through their LSE (split-KV, merge_attention_states)",
    .source_file = "merge/kernel.cu",
    .kernel_template = "flashjit::merge_states_kernel",
    .head_dims = kMergeHeadDims,
    .runs_on = runs_on_sm80_or_later,
    .check_tiles = merge_check,
    .shared_bytes = merge_shared_bytes,
    .tile_table = merge_tiles,
    .unsupported_reason = nullptr,
    .plan = nullptr,
    .template_arguments = merge_arguments,
};

Variant merge_variant(std::string_view arch, DType dtype, int head_dim) {
  return variant_of(kMergeFamily, arch, dtype, head_dim, false, kMergeTiles);
}

LaunchPlan merge_plan(long long rows) {
  LaunchPlan plan;
  plan.grid = {static_cast<unsigned>((rows + MergeShape::kWarps - 1) / MergeShape::kWarps), 1, 1};
  plan.block = {MergeShape::kThreads, 1, 1};
  return plan;
}

}  // namespace flashjit::detail

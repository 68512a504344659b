#include "families/bwd_rows/bwd_rows.hpp"

#include <fmt/format.h>

#include "bwd_rows/shape.cuh"
#include "common/bwd_workspace.cuh"
#include "families/query_tile.hpp"
#include "families/registry.hpp"

namespace flashjit::detail {
namespace {

// The one shape: tile_m = warps per CTA; tile_n and stages have no meaning here (the rows each
// CTA takes: bwd_rows/shape.cuh).
constexpr TileConfig kRowsTiles{BwdRowsShape::kWarps, 1, 1};

std::string rows_check(const Variant& v) {
  if (TileConfig{v.tile_m, v.tile_n, v.stages} != kRowsTiles)
    return fmt::format("{} variants have tiles m{}n1s1 ({} warps per CTA)", v.family,
                       BwdRowsShape::kWarps, BwdRowsShape::kWarps);
  if (v.causal) return fmt::format("{} variants have no mask: drop .causal", v.family);
  return {};
}

int rows_shared_bytes(const Variant&) { return 0; }

TileTable rows_tiles(std::string_view, int, bool, bool) { return TileTable::single(kRowsTiles); }

std::string rows_arguments(const Variant& v) { return fmt::format("{}", v.head_dim); }

// Whole pairs of columns per lane, whole float4s of the accumulator.
constexpr int kRowsHeadDims[] = {32, 64, 96, 128, 192, 256};

// The three row passes: one kernel template each, the same shape and launch rules.
constexpr KernelFamily rows_family(std::string_view name, std::string_view summary,
                                   std::string_view kernel_template) {
  return {
      .role = FamilyRole::backward_rows,
      .name = name,
      .summary = summary,
      .source_file = "bwd_rows/kernel.cu",
      .kernel_template = kernel_template,
      .head_dims = kRowsHeadDims,
      .runs_on = runs_on_sm80_or_later,
      .check_tiles = rows_check,
      .shared_bytes = rows_shared_bytes,
      .tile_table = rows_tiles,
      .unsupported_reason = nullptr,
      .plan = nullptr,
      .template_arguments = rows_arguments,
  };
}

}  // namespace

constinit extern const KernelFamily kBwdPrepFamily = rows_family(
    "bwd_prep",
    "backward's first pass: rowsum(dO * O), the LSE in exp2 units, dQ accumulator zeroed",
    "flashjit::bwd_prep_kernel");

constinit extern const KernelFamily kBwdConvertFamily =
    rows_family("bwd_convert", "backward's last pass: the fp32 dQ accumulator, scaled, to dq",
                "flashjit::bwd_convert_kernel");

constinit extern const KernelFamily kBwdSinkFamily = rows_family(
    "bwd_sink",
    "backward's learnable-sink gradient: -sum of exp(sink - lse) * rowsum(dO * O) per head",
    "flashjit::bwd_sink_kernel");

Variant bwd_prep_variant(std::string_view arch, DType dtype, int head_dim) {
  return variant_of(kBwdPrepFamily, arch, dtype, head_dim, false, kRowsTiles);
}

Variant bwd_convert_variant(std::string_view arch, DType dtype, int head_dim) {
  return variant_of(kBwdConvertFamily, arch, dtype, head_dim, false, kRowsTiles);
}

Variant bwd_sink_variant(std::string_view arch, DType dtype, int head_dim) {
  return variant_of(kBwdSinkFamily, arch, dtype, head_dim, false, kRowsTiles);
}

LaunchPlan bwd_sink_plan(int heads_q) {
  LaunchPlan plan;
  plan.grid = {static_cast<unsigned>(heads_q), 1, 1};
  plan.block = {BwdRowsShape::kThreads, 1, 1};
  return plan;
}

LaunchPlan bwd_prep_plan(int head_dim, int seqlen_q, int heads_q, int batch) {
  LaunchPlan plan;
  plan.grid = {static_cast<unsigned>(BwdWorkspaceRows::padded_rows(seqlen_q) /
                                     BwdRowsShape::prep_rows(head_dim)),
               static_cast<unsigned>(heads_q), static_cast<unsigned>(batch)};
  plan.block = {BwdRowsShape::kThreads, 1, 1};
  return plan;
}

LaunchPlan bwd_convert_plan(int head_dim, int seqlen_q, int heads_q, int batch) {
  LaunchPlan plan;
  plan.grid = {static_cast<unsigned>(BwdWorkspaceRows::padded_rows(seqlen_q) /
                                     BwdRowsShape::kConvertSide *
                                     BwdRowsShape::convert_column_blocks(head_dim)),
               static_cast<unsigned>(heads_q), static_cast<unsigned>(batch)};
  plan.block = {BwdRowsShape::kThreads, 1, 1};
  return plan;
}

}  // namespace flashjit::detail

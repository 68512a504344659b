// Host side of kernels_src/fmha_simt.cu: 4 threads per query row, Q + one K/V tile + P in smem.
#include <fmt/format.h>

#include "families.hpp"

namespace flashjit::detail {
namespace {

constexpr int kThreadsPerRow = 4;

int simt_threads(const Variant& v) { return v.tile_m * kThreadsPerRow; }

int simt_shared_bytes(const Variant& v) {
  const int row_pitch = v.head_dim + 8;
  return (v.tile_m + v.tile_n) * row_pitch * 2 + v.tile_m * (v.tile_n + 4) * 4;
}

std::string simt_check(const Variant& v) {
  if (v.head_dim % 32 != 0) return "simt needs head_dim a multiple of 32";
  if (v.tile_m < 8 || v.tile_m > 256 || v.tile_m % 8 != 0)
    return fmt::format("tile_m {} must be a multiple of 8 in [8, 256]", v.tile_m);
  if (v.tile_n < 4 || v.tile_n > 256 || v.tile_n % 4 != 0)
    return fmt::format("tile_n {} must be a multiple of 4 in [4, 256]", v.tile_n);
  if (v.stages != 1) return "simt has no pipeline: stages must be 1";
  return {};
}

TileTable simt_tiles(std::string_view, int, bool) { return TileTable::single({64, 64, 1}); }

LaunchPlan simt_plan(const Variant& v, const ForwardProblem& problem) {
  return query_tile_plan(v, problem, simt_threads(v), simt_shared_bytes(v));
}

}  // namespace

extern const FamilyTraits kSimtFamily = {
    .family = Family::simt,
    .source_file = "fmha_simt.cu",
    .kernel_template = "flashjit::fmha_simt_kernel",
    .head_dims = {32, 64, 96, 128, 192, 256},
    .runs_on = runs_on_sm80_or_later,
    .check = simt_check,
    .threads = simt_threads,
    .shared_bytes = simt_shared_bytes,
    .tile_table = simt_tiles,
    .unsupported_reason = runs_every_problem,
    .plan = simt_plan,
};

}  // namespace flashjit::detail

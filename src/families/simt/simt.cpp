// Host side of kernels_src/simt/kernel.cu: 4 threads per query row, Q + one K/V tile + P in smem
// (simt/shape.cuh).
#include <fmt/format.h>

#include "families/query_tile.hpp"
#include "simt/shape.cuh"

namespace flashjit::detail {
namespace {

SimtShape shape_of(const Variant& v) { return {v.head_dim, v.tile_m, v.tile_n}; }

std::string simt_check(const Variant& v) {
  if (v.tile_m < 8 || v.tile_m > 256 || v.tile_m % 8 != 0)
    return fmt::format("tile_m {} must be a multiple of 8 in [8, 256]", v.tile_m);
  if (v.tile_n < 4 || v.tile_n > 256 || v.tile_n % 4 != 0)
    return fmt::format("tile_n {} must be a multiple of 4 in [4, 256]", v.tile_n);
  if (v.stages != 1) return "simt has no pipeline: stages must be 1";
  return {};
}

int simt_shared_bytes(const Variant& v) { return shape_of(v).shared_bytes(); }

TileTable simt_tiles(std::string_view, int, bool, bool) { return TileTable::single({64, 64, 1}); }

LaunchPlan simt_plan(const Variant& v, const ForwardProblem& problem, const DeviceInfo&) {
  const SimtShape shape = shape_of(v);
  return query_tile_plan(v, problem, shape.threads(), shape.shared_bytes());
}

// Each thread owns whole 16-byte output vectors: head_dim / 4 threads per row, 8 per vector.
constexpr int kSimtHeadDims[] = {32, 64, 96, 128, 192, 256};

}  // namespace

constinit extern const KernelFamily kSimtFamily = {
    .features = kFeatureSoftcap,
    .name = "simt",
    .summary = "scalar fp32 math, no tensor cores: the first correct kernel",
    .source_file = "simt/kernel.cu",
    .kernel_template = "flashjit::fmha_simt_kernel",
    .head_dims = kSimtHeadDims,
    .runs_on = runs_on_sm80_or_later,
    .check_tiles = simt_check,
    .shared_bytes = simt_shared_bytes,
    .tile_table = simt_tiles,
    .unsupported_reason = runs_every_problem,
    .plan = simt_plan,
};

}  // namespace flashjit::detail

// Host side of kernels_src/bwd_mma/: the dK/dV family bwd_mma (a CTA per key tile x KV head x
// batch) and the deterministic mode's dQ family bwd_mma_dq (a CTA per query tile x head x batch).
#include "families/bwd_mma/bwd_mma.hpp"

#include <fmt/format.h>

#include "bwd_mma/shape.cuh"
#include "core/arch.hpp"
#include "families/bwd_mma/tiles.hpp"
#include "families/query_tile.hpp"
#include "families/registry.hpp"

namespace flashjit::detail {
namespace {

BwdMmaShape dkdv_shape(const Variant& v) {
  return {v.head_dim, v.tile_m, v.tile_n, v.stages, bulk_dq_reduce(arch_number(v.arch))};
}
constexpr BwdMmaDqShape dq_shape(const Variant& v) {
  return {v.head_dim, v.tile_m, v.tile_n, v.stages};
}

bool is_tile(int n) { return n == 16 || n == 32 || n == 64 || n == 128; }

// What kernels_src/bwd_mma/kernel.cu's static_asserts require, as errors.
std::string dkdv_check(const Variant& v) {
  const BwdMmaShape shape = dkdv_shape(v);
  if (!is_tile(v.tile_n)) return fmt::format("tile_n {} must be 16, 32, 64 or 128", v.tile_n);
  if (!is_tile(v.tile_m)) return fmt::format("tile_m {} must be 16, 32, 64 or 128", v.tile_m);
  if (shape.warps() > 8)
    return fmt::format("tile_n {} at head_dim {} needs {} warps: expected at most 8 (tile_n <= {})",
                       v.tile_n, v.head_dim, shape.warps(), 128 / shape.dim_split());
  if (shape.warps() % (v.tile_m / 16) != 0 || shape.dq_dims() % 16 != 0)
    return fmt::format(
        "tile_m {} does not split over the {} warps of tile_n {}: each takes whole m16 row "
        "tiles and a part of dQ's {} columns that is a multiple of 16 (expected tile_m / 16 to "
        "divide {} with head_dim / (warps / (tile_m / 16)) a multiple of 16)",
        v.tile_m, shape.warps(), v.tile_n, v.head_dim, shape.warps());
  if (v.stages != 1 && v.stages != 2)
    return fmt::format("stages {} must be 1 or 2 (Q and dO buffers)", v.stages);
  return {};
}

std::string dq_check(const Variant& v) {
  if (v.tile_m != 16 && v.tile_m != 32 && v.tile_m != 64 && v.tile_m != 128)
    return fmt::format("tile_m {} must be 16, 32, 64 or 128 (16 rows per warp)", v.tile_m);
  if (v.tile_n < 16 || v.tile_n > 128 || v.tile_n % 16 != 0)
    return fmt::format("tile_n {} must be a multiple of 16 in [16, 128]", v.tile_n);
  if (v.stages < 1 || v.stages > 3)
    return fmt::format("stages {} must be in [1, 3] (K and V buffers)", v.stages);
  return {};
}

int dkdv_shared_bytes(const Variant& v) { return dkdv_shape(v).shared_bytes(); }
int dq_shared_bytes(const Variant& v) { return dq_shape(v).shared_bytes(); }

TileTable dkdv_tiles(std::string_view arch, int head_dim, bool, bool) {
  return TileTable::single(bwd_mma_tiles_for(arch, head_dim));
}
TileTable dq_tiles(std::string_view arch, int head_dim, bool, bool) {
  return TileTable::single(bwd_mma_dq_tiles_for(arch, head_dim));
}

// The problem is the forward's whose gradients these compute.
LaunchPlan dkdv_plan(const Variant& v, const ForwardProblem& problem, const DeviceInfo&) {
  LaunchPlan plan;
  plan.grid = {static_cast<unsigned>((problem.seqlen_k + v.tile_n - 1) / v.tile_n),
               static_cast<unsigned>(problem.heads_kv), static_cast<unsigned>(problem.batch)};
  plan.block = {static_cast<unsigned>(dkdv_shape(v).threads()), 1, 1};
  plan.shared_bytes = static_cast<unsigned>(dkdv_shared_bytes(v));
  return plan;
}
LaunchPlan dq_plan(const Variant& v, const ForwardProblem& problem, const DeviceInfo&) {
  return query_tile_plan(v, problem, dq_shape(v).threads(), dq_shared_bytes(v));
}

// Multiples of 16 (whole k16 steps); beyond 128 split over two warps in whole 16-column parts.
constexpr int kHeadDims[] = {32, 64, 96, 128, 192, 256};

}  // namespace

constinit extern const KernelFamily kBwdMmaFamily = {
    .role = FamilyRole::backward,
    .features = kBackwardVariantFeatures,
    .name = "bwd_mma",
    .summary = "backward dK/dV (dQ by atomics) on mma.sync, FlashAttention-2 class",
    .source_file = "bwd_mma/kernel.cu",
    .kernel_template = "flashjit::bwd_mma_kernel",
    .head_dims = kHeadDims,
    .runs_on = runs_on_sm80_or_later,
    .check_tiles = dkdv_check,
    .shared_bytes = dkdv_shared_bytes,
    .tile_table = dkdv_tiles,
    .unsupported_reason = runs_every_problem,
    .plan = dkdv_plan,
    .template_arguments = backward_template_arguments,
    .varlen_variants = true,
};

constinit extern const KernelFamily kBwdMmaDqFamily = {
    .role = FamilyRole::backward_dq,
    .features = kBackwardVariantFeatures,
    .name = "bwd_mma_dq",
    .summary = "backward dQ alone on mma.sync, the deterministic mode (no atomics)",
    .source_file = "bwd_mma/dq_kernel.cu",
    .kernel_template = "flashjit::bwd_mma_dq_kernel",
    .head_dims = kHeadDims,
    .runs_on = runs_on_sm80_or_later,
    .check_tiles = dq_check,
    .shared_bytes = dq_shared_bytes,
    .tile_table = dq_tiles,
    .unsupported_reason = runs_every_problem,
    .plan = dq_plan,
    .template_arguments = backward_template_arguments,
    .varlen_variants = true,
};

Variant bwd_mma_dq_variant(const Variant& dkdv) {
  return variant_of(kBwdMmaDqFamily, dkdv.arch, dkdv.dtype, dkdv.head_dim, dkdv.causal,
                    bwd_mma_dq_tiles_for(dkdv.arch, dkdv.head_dim), false, dkdv.varlen,
                    dkdv.softcap, dkdv.window, false, dkdv.alibi, dkdv.user_functions);
}

}  // namespace flashjit::detail

// Host side of kernels_src/bwd_wgmma/ (Hopper, sm_90a only): the dK/dV families bwd_wgmma_fused
// (dQ too, added into the fp32 accumulator) and bwd_wgmma (key tiles x KV heads x batch, a CTA
// each or a persistent grid walking them, BwdKeyTileWalk: one kernel template), and the dQ family
// bwd_wgmma_dq (a CTA per query tile x head x batch), each a producer warpgroup and one or two
// consumers (bwd_wgmma/shape.cuh) reading q, k, v and dO through TMA tensor maps.
#include "families/bwd_wgmma/bwd_wgmma.hpp"

#include <fmt/format.h>

#include <algorithm>
#include <cstdint>
#include <limits>

#include "bwd_wgmma/shape.cuh"
#include "common/bwd_workspace.cuh"
#include "families/bwd_wgmma/tiles.hpp"
#include "families/family.hpp"
#include "families/registry.hpp"
#include "families/tma_map.hpp"

namespace flashjit::detail {
namespace {

using Limits = BwdWgmmaLimits;
static_assert(kTmaBoxWidth * Limits::kElementBytes == Limits::kRowBytes,
              "the kernels' swizzle rows are the maps' box rows");
static_assert(BwdWorkspaceRows::kRowQuantum % 128 == 0,
              "a tile's row terms lie within the workspace's padded rows");
static_assert(BwdWorkspaceRows::kRowQuantum % BwdDqBlocks::kSide == 0,
              "a sequence's rows start on a block of the fused kernel's dQ accumulator");

constexpr std::string_view kFusedName = "bwd_wgmma_fused";

constexpr BwdWgmmaShape dkdv_shape(const Variant& v) {
  return {v.head_dim, v.tile_m, v.tile_n, v.stages, v.family == kFusedName};
}
constexpr BwdWgmmaDqShape dq_shape(const Variant& v) {
  return {v.head_dim, v.tile_m, v.tile_n, v.stages};
}

std::string stages_and_bytes(const Variant& v, int shared_bytes) {
  if (v.stages < 1 || v.stages > 4) return fmt::format("stages {} must be in [1, 4]", v.stages);
  if (shared_bytes > Limits::kMaxSharedBytes)
    return fmt::format("needs {} B of shared memory: expected at most {} (what an sm_90 block may use)",
                       shared_bytes, Limits::kMaxSharedBytes);
  return {};
}

// What the kernels' static_asserts require, as errors.
std::string dkdv_check(const Variant& v) {
  const BwdWgmmaShape shape = dkdv_shape(v);
  if (v.tile_m != 64 && v.tile_m != 128)
    return fmt::format("tile_m {} must be 64 or 128 (query rows a step: a wgmma N of whole "
                       "swizzle atoms)",
                       v.tile_m);
  if (v.tile_n % 64 != 0 || v.tile_n < 64 || shape.consumers() > Limits::kMaxConsumers)
    return fmt::format("tile_n {} at head_dim {} must be {} (64 keys per consumer warpgroup{}, at "
                       "most {} consumers)",
                       v.tile_n, v.head_dim, shape.split_roles() ? "64" : "64 or 128",
                       shape.split_roles() ? ", two sharing them beyond head_dim 128" : "",
                       Limits::kMaxConsumers);
  return stages_and_bytes(v, shape.shared_bytes());
}

// The fused kernel's dQ: two consumers of 64 keys each (dS's two column blocks), each computing
// one 64 x 64 block of a step's tile_m x head_dim dQ.
std::string fused_check(const Variant& v) {
  if (std::string why = dkdv_check(v); !why.empty()) return why;
  const BwdWgmmaShape shape = dkdv_shape(v);
  if (v.tile_n != 128 || shape.dq_blocks() != shape.consumers())
    return fmt::format("tile_n {} and tile_m {} at head_dim {}: expected tile_n 128 (two consumers "
                       "of 64 keys) and tile_m {} (one 64 x 64 dQ block each)",
                       v.tile_n, v.tile_m, v.head_dim, 2 * 64 * 64 / v.head_dim);
  return {};
}

std::string dq_check(const Variant& v) {
  if (v.tile_m != 64 && v.tile_m != 128)
    return fmt::format("tile_m {} must be 64 or 128 (one or two consumer warpgroups)", v.tile_m);
  if (v.tile_n % 16 != 0 || v.tile_n < 16 || v.tile_n > Limits::kMaxBoxRows)
    return fmt::format("tile_n {} must be a multiple of 16 in [16, {}] (a wgmma N and a TMA box)",
                       v.tile_n, Limits::kMaxBoxRows);
  return stages_and_bytes(v, dq_shape(v).shared_bytes());
}

int dkdv_shared_bytes(const Variant& v) { return dkdv_shape(v).shared_bytes(); }
int dq_shared_bytes(const Variant& v) { return dq_shape(v).shared_bytes(); }

TileTable dkdv_tiles(std::string_view, int head_dim, bool, bool) {
  return TileTable::single(bwd_wgmma_tiles_for(head_dim));
}
TileTable dq_tiles(std::string_view, int head_dim, bool, bool) {
  return TileTable::single(bwd_wgmma_dq_tiles_for(head_dim));
}

std::string tma_unsupported(const ForwardProblem& problem) {
  const FmhaParams& p = problem.params;
  for (std::int64_t stride : {p.q_stride_b, p.q_stride_s, p.q_stride_h, p.k_stride_b, p.k_stride_s,
                              p.k_stride_h, p.v_stride_b, p.v_stride_s, p.v_stride_h})
    if (stride * Limits::kElementBytes >= kMaxTmaStride)
      return fmt::format("a stride of {} elements is past TMA's 2^40-byte limit", stride);
  return {};
}

// The kernels' maps, in their parameter order: q, k, v, dO, each [head_dim, rows, heads, batch]
// with boxes of q_box (Q, dO) or kv_box (K, V) rows; a varlen batch's are over its packed rows
// (batch 1), the kernels adding each sequence's start. With seqlen_q = 0 nothing reads Q or dO
// (dK and dV are zeros), and TMA cannot encode an empty dimension: those two stay unencoded.
void add_maps(LaunchPlan& plan, const ForwardProblem& problem, const BackwardParams& params,
              int q_box, int kv_box) {
  const FmhaParams& f = params.fwd;
  const bool rows = problem.seqlen_q > 0;
  const int batch = problem.varlen ? 1 : problem.batch;
  const int q_rows = problem.varlen ? problem.total_q : problem.seqlen_q;
  const int k_rows = problem.varlen ? problem.total_k : problem.seqlen_k;
  auto map = [&](MapOperand operand, const void* data, int seqlen, int heads, long long stride_s,
                 long long stride_h, long long stride_b, int box) {
    return tensor_map(operand, data, problem.dtype, problem.head_dim, seqlen, heads, batch,
                      stride_s, stride_h, stride_b, box);
  };
  plan.maps.push_back(rows ? map(MapOperand::q, f.q, q_rows, problem.heads_q, f.q_stride_s,
                                 f.q_stride_h, f.q_stride_b, q_box)
                           : TensorMapArg{});
  plan.maps.push_back(map(MapOperand::k, f.k, k_rows, problem.heads_kv, f.k_stride_s,
                          f.k_stride_h, f.k_stride_b, kv_box));
  plan.maps.push_back(map(MapOperand::v, f.v, k_rows, problem.heads_kv, f.v_stride_s,
                          f.v_stride_h, f.v_stride_b, kv_box));
  plan.maps.push_back(rows ? map(MapOperand::dout, params.dout, q_rows, problem.heads_q,
                                 params.do_stride_s, params.do_stride_h, params.do_stride_b, q_box)
                           : TensorMapArg{});
}

// One CTA a key tile, or one an SM where BwdKeyTileWalk says a persistent grid stays balanced
// (the kernel's KeyTileGrid walks the tiles either way): every launch with queries has the
// workspace's tile counter, so its causal CTAs take their tiles. Only shapes of two consumers: their
// 240-register consumers fill the register file, one CTA an SM; one of a single consumer might
// share its SM with another CTA, which a grid of one an SM would give away.
LaunchPlan dkdv_plan(const Variant& v, const ForwardProblem& problem, const BackwardParams& params,
                     const DeviceInfo& device) {
  // The kernel numbers its tiles with an int (BwdKeyTileWalk::total).
  const std::int64_t tiles =
      static_cast<std::int64_t>(BwdKeyTileWalk::key_tiles(problem.seqlen_k, v.tile_n)) *
      problem.heads_kv * problem.batch;
  if (tiles > std::numeric_limits<int>::max())
    throw Error(ErrorCode::invalid_argument,
                fmt::format("{} key tiles of {} keys (seqlen_k {} x heads_kv {} x batch {}): "
                            "expected at most {}",
                            tiles, v.tile_n, problem.seqlen_k, problem.heads_kv, problem.batch,
                            std::numeric_limits<int>::max()));
  const bool persistent = device.multiprocessors > 0 &&
                          dkdv_shape(v).consumers() == Limits::kMaxConsumers &&
                          BwdKeyTileWalk::persistent(v.causal, problem.seqlen_q > 0,
                                                     problem.seqlen_k, v.tile_n);
  LaunchPlan plan;
  plan.grid = {static_cast<unsigned>(
                   persistent ? std::min<std::int64_t>(tiles, device.multiprocessors) : tiles),
               1, 1};
  plan.block = {static_cast<unsigned>(dkdv_shape(v).threads()), 1, 1};
  plan.shared_bytes = static_cast<unsigned>(dkdv_shared_bytes(v));
  add_maps(plan, problem, params, v.tile_m, v.tile_n);
  return plan;
}

LaunchPlan dq_plan(const Variant& v, const ForwardProblem& problem, const BackwardParams& params,
                   const DeviceInfo&) {
  LaunchPlan plan;
  plan.grid = {static_cast<unsigned>((problem.seqlen_q + v.tile_m - 1) / v.tile_m),
               static_cast<unsigned>(problem.heads_q), static_cast<unsigned>(problem.batch)};
  plan.block = {static_cast<unsigned>(dq_shape(v).threads()), 1, 1};
  plan.shared_bytes = static_cast<unsigned>(dq_shared_bytes(v));
  add_maps(plan, problem, params, v.tile_m, v.tile_n);
  return plan;
}

std::string dkdv_arguments(const Variant& v) {
  return fmt::format("{}, {}", backward_template_arguments(v), v.family == kFusedName);
}

bool runs_on_sm90a(std::string_view arch) { return arch == "sm_90a"; }

// Multiples of 64: whole 128-byte swizzle rows.
constexpr int kHeadDims[] = {64, 128, 256};
// Beyond 128 two consumers share 64 keys (split roles): no room for a dQ block.
constexpr int kFusedHeadDims[] = {64, 128};

// The two dK/dV families: one kernel template, told apart by their names (dkdv_shape).
constexpr KernelFamily dkdv_family(std::string_view name, std::string_view summary,
                                   std::span<const int> head_dims,
                                   std::string (*check)(const Variant&), bool accumulates_dq) {
  return {
      .role = FamilyRole::backward,
      .features = kBackwardVariantFeatures,
      .name = name,
      .summary = summary,
      .source_file = "bwd_wgmma/kernel.cu",
      .kernel_template = "flashjit::bwd_wgmma_kernel",
      .head_dims = head_dims,
      .runs_on = runs_on_sm90a,
      .check_tiles = check,
      .shared_bytes = dkdv_shared_bytes,
      .tile_table = dkdv_tiles,
      .unsupported_reason = tma_unsupported,
      .plan = nullptr,
      .backward_plan = dkdv_plan,
      .template_arguments = dkdv_arguments,
      .varlen_variants = true,
      .always_accumulates_dq = accumulates_dq,
      .dq_accumulator_blocks = accumulates_dq,
  };
}

}  // namespace

constinit extern const KernelFamily kBwdWgmmaFusedFamily = dkdv_family(
    kFusedName,
    "backward dK/dV and dQ in one kernel on TMA + wgmma, warp-specialized (dQ added up by bulk "
    "reductions: not deterministic)",
    kFusedHeadDims, fused_check, true);

constinit extern const KernelFamily kBwdWgmmaFamily = dkdv_family(
    "bwd_wgmma", "backward dK/dV on TMA + wgmma, warp-specialized (dQ by bwd_wgmma_dq, no atomics)",
    kHeadDims, dkdv_check, false);

constinit extern const KernelFamily kBwdWgmmaDqFamily = {
    .role = FamilyRole::backward_dq,
    .features = kBackwardVariantFeatures,
    .name = "bwd_wgmma_dq",
    .summary = "backward dQ alone on TMA + wgmma, warp-specialized (after bwd_wgmma, both modes)",
    .source_file = "bwd_wgmma/dq_kernel.cu",
    .kernel_template = "flashjit::bwd_wgmma_dq_kernel",
    .head_dims = kHeadDims,
    .runs_on = runs_on_sm90a,
    .check_tiles = dq_check,
    .shared_bytes = dq_shared_bytes,
    .tile_table = dq_tiles,
    .unsupported_reason = tma_unsupported,
    .plan = nullptr,
    .backward_plan = dq_plan,
    .template_arguments = backward_template_arguments,
    .varlen_variants = true,
};

Variant bwd_wgmma_dq_variant(const Variant& dkdv) {
  return variant_of(kBwdWgmmaDqFamily, dkdv.arch, dkdv.dtype, dkdv.head_dim, dkdv.causal,
                    bwd_wgmma_dq_tiles_for(dkdv.head_dim), false, dkdv.varlen, dkdv.softcap,
                    dkdv.window, false, dkdv.alibi, dkdv.user_functions);
}

}  // namespace flashjit::detail

// Host side of kernels_src/wgmma/kernel.cu (Hopper, sm_90a only): one producer warpgroup plus
// tile_m/64 consumer warpgroups (wgmma/shape.cuh), TMA tensor maps over q, k, v and o, and a
// persistent grid of one CTA per SM walking a schedule of query tiles (wgmma/schedule.cuh).
// Dense batches, (Variant::varlen) varlen batches or seqused_k, and (Variant::paged) paged KV
// caches, read in page-sized runs of rows or, in small pages, gathered row by row.
#include <cuda.h>
#include <fmt/format.h>

#include <climits>
#include <cstdint>
#include <cstring>

#include "common/page_boxes.cuh"
#include "cuda/driver.hpp"
#include "decode/shape.cuh"
#include "families/family.hpp"
#include "families/tma_map.hpp"
#include "families/wgmma/schedule.hpp"
#include "wgmma/shape.cuh"

namespace flashjit::detail {
namespace {

using Geometry = WgmmaGeometry;
static_assert(Geometry::kBoxWidth == kTmaBoxWidth, "the kernel's boxes are the maps' boxes");

Geometry geometry_of(const Variant& v) {
  return {v.head_dim, v.tile_m, v.tile_n, v.stages, v.varlen,
          Geometry::takes_causal_alibi(v.alibi, v.causal, v.softcap, !v.user_functions.empty())};
}

int wgmma_shared_bytes(const Variant& v) { return geometry_of(v).shared_bytes(); }

std::string wgmma_check(const Variant& v) {
  if (v.tile_m % Geometry::kRowsPerConsumer != 0 || v.tile_m < 64 || v.tile_m > 192)
    return fmt::format("tile_m {} must be 64, 128 or 192 (one to three consumer warpgroups)",
                       v.tile_m);
  if (v.tile_n % 16 != 0 || v.tile_n < 16 || v.tile_n > Geometry::kMaxBoxRows)
    return fmt::format("tile_n {} must be a multiple of 16 in [16, {}] (a wgmma N and a TMA box)",
                       v.tile_n, Geometry::kMaxBoxRows);
  if (v.paged && ((v.tile_n & (v.tile_n - 1)) != 0 || v.tile_n > kMaxPagedTileN))
    return fmt::format(
        "tile_n {} must be a power of two of at most {} in a paged variant (page-sized runs of "
        "rows fill it; a gathered tile's rows are 8 per producer lane group)",
        v.tile_n, kMaxPagedTileN);
  if (v.stages < 1 || v.stages > 8)
    return fmt::format("stages {} must be in [1, 8] (K/V ring depth)", v.stages);
  if (const int bytes = wgmma_shared_bytes(v); bytes > Geometry::kMaxSharedBytes)
    return fmt::format(
        "needs {} B of shared memory: expected at most {} (what an sm_90 block "
        "may use)",
        bytes, Geometry::kMaxSharedBytes);
  return {};
}

// Tile sizes measured on an H200 (bf16, 16k tokens; docs/perf-log.md, wgmma section), starting
// from FlashAttention-3's (d64 192 x 128, d128 128 x 176 or 128 x 128 causal, d256 128 x 80).
// Short sequences take 128-key (and for causal d64 128-query) tiles: the last key tile of a
// 512-key row is 20-30 % padding with 160-176 keys, and under the causal diagonal a 192-row tile
// visits keys only its bottom rows need.
// Paged caches take power-of-two key tiles (runs of rows of one page fill them): d128 128 keys,
// d256 64 (d64's are already 128).
TileTable wgmma_tiles(std::string_view, int head_dim, bool causal, bool paged) {
  if (paged && head_dim > 128) return TileTable::single({128, 64, 2});
  if (paged && head_dim > 64)
    return causal ? TileTable::single({128, 128, 2})
                  : TileTable{{{{1024, {128, 128, 3}}, {INT_MAX, {128, 128, 2}}}}, 2};
  if (head_dim <= 64)
    return causal ? TileTable{{{{4096, {128, 128, 3}}, {INT_MAX, {192, 128, 2}}}}, 2}
                  : TileTable::single({192, 128, 3});
  if (head_dim <= 128)
    return causal ? TileTable{{{{4096, {128, 128, 2}}, {INT_MAX, {128, 176, 2}}}}, 2}
                  : TileTable{{{{1024, {128, 128, 3}}, {INT_MAX, {128, 160, 2}}}}, 2};
  // d256: 80 keys (128 x 64 until the consumers stopped taking turns at d256: then 80 spilled
  // 180 bytes; since, 0, and 2-4 % faster than 64 causal at 16k; session 7). Causal rows of at
  // most 1k keys take 64: 512 keys are 8 whole tiles (80 leave a 32-key one), and the diagonal
  // tile is smaller (H100, session 33: 1.052x at 512, 1.020x at 1k).
  return causal ? TileTable{{{{1024, {128, 64, 2}}, {INT_MAX, {128, 80, 2}}}}, 2}
                : TileTable::single({128, 80, 2});
}

std::string wgmma_unsupported(const ForwardProblem& problem) {
  const FmhaParams& p = problem.params;
  // A decode step's few rows per KV head would fill a sliver of each 128-row tile, and where
  // decode_tma refuses their pages (small ones at d64 / d256) the cp.async kernel gathers them.
  if (problem.paged && problem.rows_per_kv_head() <= DecodeShape::kMaxRowsPerKvHead)
    return fmt::format(
        "leaves paged problems of at most {} query rows per KV head (seqlen_q x heads_q / "
        "heads_kv; decode steps) to the decode kernels, this problem has {}",
        DecodeShape::kMaxRowsPerKvHead, problem.rows_per_kv_head());
  const std::int64_t most_tiles =
      (std::int64_t{problem.seqlen_q} + Geometry::kRowsPerConsumer - 1) /
      Geometry::kRowsPerConsumer * problem.batch * problem.heads_q;
  if (most_tiles > INT32_MAX)
    return fmt::format("{} query tiles do not fit the tile schedule's 32-bit index", most_tiles);
  for (std::int64_t stride :
       {p.q_stride_b, p.q_stride_s, p.q_stride_h, p.k_stride_b, p.k_stride_s, p.k_stride_h,
        p.v_stride_b, p.v_stride_s, p.v_stride_h, p.o_stride_b, p.o_stride_s, p.o_stride_h})
    if (stride * 2 >= kMaxTmaStride)
      return fmt::format("a stride of {} elements is past TMA's 2^40-byte limit", stride);
  return {};
}

template <typename T>
std::vector<std::byte> as_bytes(const T& value) {
  std::vector<std::byte> bytes(sizeof(T));
  std::memcpy(bytes.data(), &value, sizeof(T));
  return bytes;
}

LaunchPlan wgmma_plan(const Variant& v, const ForwardProblem& problem, const DeviceInfo& device) {
  const FmhaParams& p = problem.params;
  const WgmmaLaunchSchedule walk = wgmma_schedule(v, problem, device);
  const Geometry geometry = geometry_of(v);
  LaunchPlan plan;
  plan.takes_tile_counter = walk.takes_tile_counter;
  plan.grid = {walk.ctas, 1, 1};
  plan.block = {static_cast<unsigned>(geometry.threads()), 1, 1};
  plan.shared_bytes = static_cast<unsigned>(geometry.shared_bytes());
  // Maps are [head_dim, rows, heads, blocks]: a varlen batch is one block of all its packed rows
  // (loads past a sequence read the next one's rows, which the kernel masks or does not store).
  const int q_rows = problem.varlen ? problem.total_q : problem.seqlen_q;
  const int blocks = problem.varlen ? 1 : problem.batch;
  // K and V: pages of a paged cache ([head_dim, page_size, heads, num_pages], boxes of a run of
  // rows within a page), else as Q.
  const int kv_rows = problem.paged    ? problem.page_size
                      : problem.varlen ? problem.total_k
                                       : problem.seqlen_k;
  const int kv_blocks = problem.paged ? problem.num_pages : blocks;
  const int kv_box_rows = problem.paged ? page_box_rows(problem.page_size, v.tile_n) : v.tile_n;
  plan.maps.push_back(tensor_map(MapOperand::q, p.q, problem.dtype, problem.head_dim, q_rows,
                                 problem.heads_q, blocks, p.q_stride_s, p.q_stride_h, p.q_stride_b,
                                 v.tile_m));
  plan.maps.push_back(tensor_map(MapOperand::k, p.k, problem.dtype, problem.head_dim, kv_rows,
                                 problem.heads_kv, kv_blocks, p.k_stride_s, p.k_stride_h,
                                 p.k_stride_b, kv_box_rows));
  plan.maps.push_back(tensor_map(MapOperand::v, p.v, problem.dtype, problem.head_dim, kv_rows,
                                 problem.heads_kv, kv_blocks, p.v_stride_s, p.v_stride_h,
                                 p.v_stride_b, kv_box_rows));
  // Each consumer warpgroup stores its own 64 rows. Variants that store O from registers never
  // read this parameter (the kernel signature is the same for all): zeros, never encoded.
  plan.maps.push_back(geometry.stages_output()
                          ? tensor_map(MapOperand::o, p.o, problem.dtype, problem.head_dim, q_rows,
                                       problem.heads_q, blocks, p.o_stride_s, p.o_stride_h,
                                       p.o_stride_b, Geometry::kRowsPerConsumer)
                          : TensorMapArg{});
  plan.values.push_back(as_bytes(walk.schedule));
  return plan;
}

std::string wgmma_arguments(const Variant& v) {
  return fmt::format("{}, {}, {}, {}, {}, {}, {}, {}, {}, {}, {}", v.head_dim, v.tile_m, v.tile_n,
                     v.stages, v.causal, v.varlen, v.softcap, v.window, v.sink, v.alibi, v.paged);
}

// Multiples of 64: whole 128-byte swizzle rows.
constexpr int kWgmmaHeadDims[] = {64, 128, 256};

}  // namespace

constinit extern const KernelFamily kWgmmaFamily = {
    .features = kFeatureUserFunctions | kFeatureBlockMask | kFeaturePagedKv | kFeatureSeqUsedK |
                kFeatureVarlen | kFeatureSoftcap | kFeatureWindow | kFeatureSink | kFeatureAlibi,
    .name = "wgmma",
    .summary = "TMA + wgmma, warp-specialized and persistent, FlashAttention-3 class",
    .source_file = "wgmma/kernel.cu",
    .kernel_template = "flashjit::fmha_wgmma_kernel",
    .head_dims = kWgmmaHeadDims,
    .runs_on = [](std::string_view arch) { return arch == "sm_90a"; },
    .check_tiles = wgmma_check,
    .shared_bytes = wgmma_shared_bytes,
    .tile_table = wgmma_tiles,
    .unsupported_reason = wgmma_unsupported,
    .plan = wgmma_plan,
    .template_arguments = wgmma_arguments,
    .varlen_variants = true,
};

}  // namespace flashjit::detail

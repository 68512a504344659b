// Host side of kernels_src/fmha_wgmma.cu (Hopper, sm_90a only): one producer warpgroup plus
// tile_m/64 consumer warpgroups, TMA tensor maps over q, k, v and o, and a persistent grid of one
// CTA per SM walking a schedule of query tiles.
#include <cuda.h>
#include <fmt/format.h>

#include <algorithm>
#include <climits>
#include <cstdint>
#include <cstring>

#include "driver.hpp"
#include "families.hpp"

namespace flashjit::detail {
namespace {

constexpr int kWarpgroupThreads = 128;
constexpr int kRowsPerConsumer = 64;  // wgmma M
constexpr int kBoxWidth = 64;         // elements in a 128-byte swizzle row: the TMA box's width
constexpr int kMaxBoxRows = 256;      // TMA box limit per dimension
constexpr int kAlignSlack = 1024;     // the kernel aligns its tiles to the 1024-byte swizzle atom
constexpr int kMaxSharedBytes = 232448;  // 227 KiB: the most a block may opt into on sm_90
constexpr std::int64_t kMaxTmaStride = std::int64_t{1} << 40;

// Mirrors WgmmaSchedule in kernels_src/fmha_wgmma.cu (passed by value after the tensor maps q, k,
// v, o).
struct WgmmaSchedule {
  std::int32_t m_tiles;
  std::int32_t units_per_pair;
  std::int32_t total_units;
  std::int32_t heads_per_group;
};

int consumers(const Variant& v) { return v.tile_m / kRowsPerConsumer; }

int wgmma_threads(const Variant& v) { return (consumers(v) + 1) * kWarpgroupThreads; }

// Matches WgmmaShape and PipelineBarriers in the kernel: Q, Stages x (K, V), O's staging buffer
// when the kernel stores O with TMA, then the mbarriers (q full/empty, full/empty per K/V stage).
struct SharedLayout {
  int tiles, output, barriers;
  explicit SharedLayout(const Variant& v)
      : tiles((v.tile_m + 2 * v.stages * v.tile_n) * v.head_dim * 2),
        output(v.tile_m * v.head_dim * 2),
        barriers((2 + 4 * v.stages) * 8) {}
};

// WgmmaShape::kStageO: three consumers, and O's staging buffer fits beside the pipeline.
bool stages_output(const Variant& v) {
  const SharedLayout l(v);
  return consumers(v) == 3 && kAlignSlack + l.tiles + l.output + l.barriers <= kMaxSharedBytes;
}

int wgmma_shared_bytes(const Variant& v) {
  const SharedLayout l(v);
  return kAlignSlack + l.tiles + (stages_output(v) ? l.output : 0) + l.barriers;
}

std::string wgmma_check(const Variant& v) {
  if (v.head_dim % kBoxWidth != 0)
    return fmt::format("wgmma needs head_dim a multiple of {} (whole 128-byte swizzle rows)",
                       kBoxWidth);
  if (v.tile_m % kRowsPerConsumer != 0 || v.tile_m < 64 || v.tile_m > 192)
    return fmt::format("tile_m {} must be 64, 128 or 192 (one to three consumer warpgroups)",
                       v.tile_m);
  if (v.tile_n % 16 != 0 || v.tile_n < 16 || v.tile_n > kMaxBoxRows)
    return fmt::format("tile_n {} must be a multiple of 16 in [16, {}] (a wgmma N and a TMA box)",
                       v.tile_n, kMaxBoxRows);
  if (v.stages < 1 || v.stages > 8)
    return fmt::format("stages {} must be in [1, 8] (K/V ring depth)", v.stages);
  return {};
}

// Tile sizes measured on an H200 (bf16, 16k tokens; docs/perf-log.md, wgmma section), starting
// from FlashAttention-3's (d64 192 x 128, d128 128 x 176 or 128 x 128 causal, d256 128 x 80).
// Short sequences take 128-key (and for causal d64 128-query) tiles: the last key tile of a
// 512-key row is 20-30 % padding with 160-176 keys, and under the causal diagonal a 192-row tile
// visits keys only its bottom rows need.
TileTable wgmma_tiles(std::string_view, int head_dim, bool causal) {
  if (head_dim <= 64)
    return causal ? TileTable{{{{4096, {128, 128, 3}}, {INT_MAX, {192, 128, 2}}}}, 2}
                  : TileTable::single({192, 128, 3});
  if (head_dim <= 128)
    return causal ? TileTable{{{{4096, {128, 128, 2}}, {INT_MAX, {128, 176, 2}}}}, 2}
                  : TileTable{{{{1024, {128, 128, 3}}, {INT_MAX, {128, 160, 2}}}}, 2};
  // d256 causal stays at 64 keys: with 80, the causal kernel spills (180 bytes).
  return TileTable::single({128, causal ? 64 : 80, 2});
}

std::string wgmma_unsupported(const ForwardProblem& problem) {
  const FmhaParams& p = problem.params;
  const std::int64_t most_tiles = (std::int64_t{problem.seqlen_q} + kRowsPerConsumer - 1) /
                                  kRowsPerConsumer * problem.batch * problem.heads_q;
  if (most_tiles > INT32_MAX)
    return fmt::format("{} query tiles do not fit the tile schedule's 32-bit index", most_tiles);
  for (std::int64_t stride : {p.q_stride_b, p.q_stride_s, p.q_stride_h, p.k_stride_b, p.k_stride_s,
                              p.k_stride_h, p.v_stride_b, p.v_stride_s, p.v_stride_h, p.o_stride_b,
                              p.o_stride_s, p.o_stride_h})
    if (stride * 2 >= kMaxTmaStride)
      return fmt::format("a stride of {} elements is past TMA's 2^40-byte limit", stride);
  return {};
}

// A rank-4 TMA map [head_dim, seqlen, heads, batch] over a tensor's real strides, moving boxes of
// 64 x box_rows to or from 128-byte-swizzled shared memory. Every dimension is bounded: loads
// read rows past seqlen as zeros, stores skip them.
std::vector<std::byte> tensor_map(const void* data, DType dtype, int head_dim, int seqlen,
                                  int heads, int batch, std::int64_t stride_s,
                                  std::int64_t stride_h, std::int64_t stride_b, int box_rows) {
  const cuuint64_t dims[4] = {static_cast<cuuint64_t>(head_dim), static_cast<cuuint64_t>(seqlen),
                              static_cast<cuuint64_t>(heads), static_cast<cuuint64_t>(batch)};
  const std::int64_t element_strides[3] = {stride_s, stride_h, stride_b};
  cuuint64_t strides[3];
  std::uint64_t packed = static_cast<std::uint64_t>(head_dim) * 2;  // bytes of a packed row
  for (int i = 0; i < 3; ++i) {
    // A size-1 dimension is never stepped along, and its stride may be anything (validate lets
    // it through); TMA still wants a multiple of 16, so give it the packed one.
    strides[i] = dims[i + 1] > 1 ? static_cast<cuuint64_t>(element_strides[i]) * 2
                                 : (packed + 15) / 16 * 16;
    packed = strides[i] * dims[i + 1];
  }
  const cuuint32_t box[4] = {static_cast<cuuint32_t>(kBoxWidth), static_cast<cuuint32_t>(box_rows),
                             1, 1};
  const cuuint32_t steps[4] = {1, 1, 1, 1};
  CUtensorMap map;
  check(driver().cuTensorMapEncodeTiled(
            &map, dtype == DType::bf16 ? CU_TENSOR_MAP_DATA_TYPE_BFLOAT16
                                       : CU_TENSOR_MAP_DATA_TYPE_FLOAT16,
            4, const_cast<void*>(data), dims, strides, box, steps, CU_TENSOR_MAP_INTERLEAVE_NONE,
            CU_TENSOR_MAP_SWIZZLE_128B, CU_TENSOR_MAP_L2_PROMOTION_L2_256B,
            CU_TENSOR_MAP_FLOAT_OOB_FILL_NONE),
        "cuTensorMapEncodeTiled");
  std::vector<std::byte> bytes(sizeof(map));
  std::memcpy(bytes.data(), &map, sizeof(map));
  return bytes;
}

template <typename T>
std::vector<std::byte> as_bytes(const T& value) {
  std::vector<std::byte> bytes(sizeof(T));
  std::memcpy(bytes.data(), &value, sizeof(T));
  return bytes;
}

LaunchPlan wgmma_plan(const Variant& v, const ForwardProblem& problem) {
  const DriverApi& cu = driver();
  CUdevice device = 0;
  check(cu.cuCtxGetDevice(&device), "cuCtxGetDevice");
  int sms = 0, l2_bytes = 0;
  check(cu.cuDeviceGetAttribute(&sms, CU_DEVICE_ATTRIBUTE_MULTIPROCESSOR_COUNT, device),
        "cuDeviceGetAttribute(MULTIPROCESSOR_COUNT)");
  check(cu.cuDeviceGetAttribute(&l2_bytes, CU_DEVICE_ATTRIBUTE_L2_CACHE_SIZE, device),
        "cuDeviceGetAttribute(L2_CACHE_SIZE)");

  const FmhaParams& p = problem.params;
  WgmmaSchedule schedule{};
  schedule.m_tiles = (problem.seqlen_q + v.tile_m - 1) / v.tile_m;
  const std::int64_t pairs = std::int64_t{problem.batch} * problem.heads_q;
  // Causal work units pair the tile k with tile m_tiles - 1 - k of the same head (equal cost).
  schedule.units_per_pair = problem.causal ? (schedule.m_tiles + 1) / 2 : schedule.m_tiles;
  schedule.total_units = static_cast<std::int32_t>(schedule.units_per_pair * pairs);
  // Half of L2 for the K and V of the heads being worked on at once; the rest for Q, O and others.
  const std::int64_t kv_bytes_per_pair = std::int64_t{problem.seqlen_k} * problem.head_dim * 2 * 2;
  schedule.heads_per_group = static_cast<std::int32_t>(
      std::clamp<std::int64_t>(l2_bytes / 2 / std::max<std::int64_t>(kv_bytes_per_pair, 1), 1,
                               pairs));

  LaunchPlan plan;
  plan.grid = {static_cast<unsigned>(std::min<std::int64_t>(schedule.total_units, sms)), 1, 1};
  plan.block = {static_cast<unsigned>(wgmma_threads(v)), 1, 1};
  plan.shared_bytes = static_cast<unsigned>(wgmma_shared_bytes(v));
  plan.extra_args.push_back(tensor_map(p.q, problem.dtype, problem.head_dim, problem.seqlen_q,
                                       problem.heads_q, problem.batch, p.q_stride_s, p.q_stride_h,
                                       p.q_stride_b, v.tile_m));
  plan.extra_args.push_back(tensor_map(p.k, problem.dtype, problem.head_dim, problem.seqlen_k,
                                       problem.heads_kv, problem.batch, p.k_stride_s, p.k_stride_h,
                                       p.k_stride_b, v.tile_n));
  plan.extra_args.push_back(tensor_map(p.v, problem.dtype, problem.head_dim, problem.seqlen_k,
                                       problem.heads_kv, problem.batch, p.v_stride_s, p.v_stride_h,
                                       p.v_stride_b, v.tile_n));
  // Each consumer warpgroup stores its own 64 rows. Variants that store O from registers never
  // read this parameter (the kernel signature is the same for all): zeros, no encoding per call.
  plan.extra_args.push_back(stages_output(v)
                                ? tensor_map(p.o, problem.dtype, problem.head_dim,
                                             problem.seqlen_q, problem.heads_q, problem.batch,
                                             p.o_stride_s, p.o_stride_h, p.o_stride_b,
                                             kRowsPerConsumer)
                                : std::vector<std::byte>(sizeof(CUtensorMap)));
  plan.extra_args.push_back(as_bytes(schedule));
  return plan;
}

}  // namespace

extern const FamilyTraits kWgmmaFamily = {
    .family = Family::wgmma,
    .source_file = "fmha_wgmma.cu",
    .kernel_template = "flashjit::fmha_wgmma_kernel",
    .head_dims = {64, 128, 256},
    .runs_on = [](std::string_view arch) { return arch == "sm_90a"; },
    .check = wgmma_check,
    .threads = wgmma_threads,
    .shared_bytes = wgmma_shared_bytes,
    .tile_table = wgmma_tiles,
    .unsupported_reason = wgmma_unsupported,
    .plan = wgmma_plan,
};

}  // namespace flashjit::detail

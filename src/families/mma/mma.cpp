// Host side of kernels_src/mma/kernel.cu: 4 warps, each owning tile_m/4 query rows; shared memory
// holds the Q tile and `stages` K and V tiles, rows padded by 16 bytes (mma/shape.cuh). Dense
// batches, (Variant::varlen) varlen batches or seqused_k, and (Variant::paged) paged caches, whose
// rows the kernel gathers through the page table.
#include <fmt/format.h>

#include <algorithm>
#include <iterator>

#include "core/arch.hpp"
#include "families/query_tile.hpp"
#include "mma/shape.cuh"

namespace flashjit::detail {
namespace {

int mma_shared_bytes(const Variant& v) {
  return MmaShape{v.head_dim, v.tile_m, v.tile_n, v.stages}.shared_bytes();
}

std::string mma_check(const Variant& v) {
  if (v.tile_m != 64 && v.tile_m != 128)
    return fmt::format("tile_m {} must be 64 or 128 (4 warps of 16 or 32 rows)", v.tile_m);
  if (v.tile_m == 128 && v.head_dim > 128)
    return fmt::format(
        "tile_m 128 with head_dim {} needs more than 255 registers per thread for "
        "the output accumulator: use tile_m 64",
        v.head_dim);
  if (v.tile_n < 16 || v.tile_n > 256 || v.tile_n % 16 != 0)
    return fmt::format("tile_n {} must be a multiple of 16 in [16, 256]", v.tile_n);
  if (v.stages < 1 || v.stages > 4)
    return fmt::format("stages {} must be in [1, 4] (K and V buffers each)", v.stages);
  return {};
}

// The dispatcher's tile table. Arch groups differ in shared memory per block: sm_86, sm_89 and
// sm_120 allow 99 KB, sm_80 and sm_87 163 KB, Hopper and datacenter Blackwell 227 KB. The big
// group was chosen by measurement on an H200 (docs/perf-log.md, mma section); the others follow
// FlashAttention-2's choices for those parts, resized to fit with the row padding.
enum class SmemClass { kb99, kb163, kb227 };

struct TileRow {
  SmemClass smem;
  int head_dim;
  TileConfig full;  // non-causal
  TileConfig causal;
};

// clang-format off
constexpr TileRow kTileTable[] = {
    // smem             d      non-causal     causal
    {SmemClass::kb227,  32, {128, 128, 2}, {128, 128, 2}},
    {SmemClass::kb227,  64, {128, 128, 2}, {128, 128, 2}},
    {SmemClass::kb227,  96, {128,  64, 2}, {128,  64, 2}},
    {SmemClass::kb227, 128, {128,  48, 3}, {128,  48, 2}},
    {SmemClass::kb227, 192, { 64,  32, 2}, { 64,  32, 2}},
    {SmemClass::kb227, 256, { 64,  64, 1}, { 64,  64, 1}},

    {SmemClass::kb163,  32, {128, 128, 2}, {128, 128, 2}},
    {SmemClass::kb163,  64, {128, 128, 1}, {128, 128, 1}},
    {SmemClass::kb163,  96, {128,  64, 1}, {128,  64, 1}},
    {SmemClass::kb163, 128, {128,  48, 1}, {128,  48, 1}},
    {SmemClass::kb163, 192, { 64,  64, 1}, { 64,  64, 1}},
    {SmemClass::kb163, 256, { 64,  32, 1}, { 64,  32, 1}},

    {SmemClass::kb99,   32, {128,  64, 2}, {128,  64, 2}},
    {SmemClass::kb99,   64, {128,  64, 2}, {128,  64, 2}},
    {SmemClass::kb99,   96, {128,  32, 2}, {128,  32, 2}},
    {SmemClass::kb99,  128, {128,  32, 2}, { 64,  64, 1}},
    {SmemClass::kb99,  192, { 64,  32, 2}, { 64,  64, 1}},
    {SmemClass::kb99,  256, { 64,  32, 1}, { 64,  32, 1}},
};
// clang-format on

SmemClass smem_class(std::string_view arch) {
  const int number = arch_number(arch);
  if (number == 80 || number == 87) return SmemClass::kb163;
  if (number >= 90 && number < 120) return SmemClass::kb227;
  return SmemClass::kb99;  // sm_86, sm_89, sm_120, sm_121 and anything unknown
}

TileTable mma_tiles(std::string_view arch, int head_dim, bool causal, bool) {
  const SmemClass smem = smem_class(arch);
  const auto row =
      std::find_if(std::begin(kTileTable), std::end(kTileTable),
                   [&](const TileRow& r) { return r.smem == smem && r.head_dim == head_dim; });
  // A head dim without a tuned row gets a small shape that fits everywhere.
  if (row == std::end(kTileTable)) return TileTable::single({64, 64, 1});
  return TileTable::single(causal ? row->causal : row->full);
}

// Varlen: seqlen_q is the longest sequence's and batch the sequence count, so the grid covers
// every sequence's query tiles.
LaunchPlan mma_plan(const Variant& v, const ForwardProblem& problem, const DeviceInfo&) {
  return query_tile_plan(v, problem, MmaShape::kThreads, mma_shared_bytes(v));
}

std::string mma_arguments(const Variant& v) {
  return fmt::format("{}, {}, {}, {}, {}, {}, {}, {}, {}, {}, {}", v.head_dim, v.tile_m, v.tile_n,
                     v.stages, v.causal, v.softcap, v.window, v.sink, v.alibi, v.varlen, v.paged);
}

// Multiples of 16: whole mma k-steps.
constexpr int kMmaHeadDims[] = {32, 64, 96, 128, 192, 256};

}  // namespace

constinit extern const KernelFamily kMmaFamily = {
    .features = kFeatureUserFunctions | kFeatureBlockMask | kFeaturePagedKv | kFeatureSeqUsedK |
                kFeatureVarlen | kFeatureSoftcap | kFeatureWindow | kFeatureSink | kFeatureAlibi,
    .name = "mma",
    .summary = "tensor cores through mma.sync, FlashAttention-2 class",
    .source_file = "mma/kernel.cu",
    .kernel_template = "flashjit::fmha_mma_kernel",
    .head_dims = kMmaHeadDims,
    .runs_on = runs_on_sm80_or_later,
    .check_tiles = mma_check,
    .shared_bytes = mma_shared_bytes,
    .tile_table = mma_tiles,
    .unsupported_reason = runs_every_problem,
    .plan = mma_plan,
    .template_arguments = mma_arguments,
    .varlen_variants = true,
};

}  // namespace flashjit::detail

// Host side of kernels_src/decode/kernel.cu: split-KV decode with GQA packing over dense or paged
// KV caches (decode/shape.cuh). The split heuristic lives in split_heuristic.cpp.
#include <fmt/format.h>

#include "core/arch.hpp"
#include "common/page_boxes.cuh"
#include "decode/shape.cuh"
#include "merge/shape.cuh"
#include "families/decode/split_heuristic.hpp"
#include "families/query_tile.hpp"
#include "families/registry.hpp"
#include "families/tma_map.hpp"

namespace flashjit::detail {

DecodeShape decode_shape(const Variant& v) {
  return {v.head_dim, v.tile_m, v.tile_n, v.stages, v.family == "decode_tma"};
}

namespace {

bool loads_with_tma(const Variant& v) { return decode_shape(v).tma; }

int decode_shared_bytes(const Variant& v) { return decode_shape(v).shared_bytes(); }

std::string decode_check(const Variant& v) {
  if (v.tile_m != 16 && v.tile_m != 32 && v.tile_m != 64)
    return fmt::format("tile_m {} must be 16, 32 or 64 (query rows per KV head in one CTA)",
                       v.tile_m);
  if (v.tile_m >= 32 && v.head_dim > 128)
    return fmt::format(
        "tile_m {} with head_dim {} needs more than 255 registers per thread for the output "
        "accumulator: use tile_m 16",
        v.tile_m, v.head_dim);
  if (v.tile_n != 64 && v.tile_n != 128)
    return fmt::format("tile_n {} must be 64 or 128 (4 warps of 16 or 32 keys)", v.tile_n);
  if (v.stages < 2 || v.stages > 6) return fmt::format("stages {} must be in [2, 6]", v.stages);
  return {};
}

// Three tiles per head dim and arch: 16 rows (decode, GQA up to 16:1), 32 rows (speculative
// decode) and 64 (33-64 rows); d256 takes 16 only (registers: see decode_check). On Hopper-class
// parts three stages keep two CTAs of 16 or 32 rows per SM with two stages in flight each;
// d256 on parts with 99 KB per block does not fit (dense problems fall back to mma).
// Tiles of 64 rows (two row groups reading each K/V tile once, where two 32-row CTAs read it
// twice; one CTA per SM): H100, seqlen_q 16 x GQA 4:1 over 8k keys, batch 64, d128 0.706 ms
// dense / 0.730 over pages of 64 against 0.774 / 0.776 for 32 x 64 x 3 (4 stages 0.725 / 0.732,
// 5 0.726 / 0.732); d64 0.362 / 0.379 against 0.393 / 0.399; the cp.async kernel 0.951 against
// 1.153 (docs/perf-log.md, session 30).
TileTable decode_tiles(std::string_view arch, int head_dim, bool, bool) {
  const int number = arch_number(arch);
  const bool hopper_class = number >= 90 && number < 120;  // 227 KB of shared memory per block
  const int tile_n = head_dim == 64 ? 128 : 64;
  const int stages = hopper_class && head_dim <= 128 ? 3 : 2;
  if (head_dim > 128) return TileTable::single({16, tile_n, stages});  // registers: see check
  TileTable table;
  table.rules[0] = {INT_MAX, TileConfig{16, tile_n, stages}, 16};
  table.rules[1] = {INT_MAX, TileConfig{32, tile_n, stages}, 32};
  table.rules[2] = {INT_MAX, TileConfig{64, tile_n, stages}};
  table.count = 3;
  return table;
}

// Hopper with TMA loads, d128 (docs/perf-log.md, decode sections; batch-64 decode, dense 478.5 us):
// - 16 rows, dense, up to 16k keys: the 32-row tile below (two CTAs per SM; 476.8 / 480.0 /
//   483.3 us at seqlen_q 1 / 2 / 4 against 478.8 / 485.4 / 489.4 for 16 x 128 x 2, and 16 x 64 x 2
//   at 515 / 523 in one split, 488 / 502 in the three splits the heuristic gives it);
// - 16 rows, dense, longer: 128-key tiles in two stages (one CTA per SM streaming 64 KB stages:
//   batch 1 x 128k 130.7 us in 16 splits against 134.5 for 32 x 64 x 2 in 33; 477 us at batch
//   64 x 8k against 482 for 64 x 3);
// - 16 rows over pages of 64 rows or more: 128-key tiles in three stages (pages of 64 / 128 / 256:
//   487 / 482 / 482 us against 513 / 501 / 499 with two: the scattered pages want a stage more in
//   flight);
// - 16 rows over pages of 16 or 32 rows: 64-key tiles in two stages, three CTAs per SM (pages of
//   16: 499.9 us, in 3 splits at batch 64, against 505.2 with three stages, 597 for 128 x 3 and
//   555 for the cp.async kernel; 32: 492.8);
// - 32 rows: 64-key tiles (128 would spill: 255 registers), two stages on a dense cache (478.8 us
//   at seqlen_q 8 against 488.3 with three), three over pages;
// - 33-64 rows: 64 x 64 x 3 (see decode_tiles); over pages of 16 or 32 rows 64 x 128 x 3 (H100,
//   seqlen_q 12 x GQA 4:1, batch 64 x 8k, pages of 16: causal 0.770 ms against 0.813, not causal
//   0.777 against 0.829, though it spills 8 / 84 B; pages of 32, causal: 0.737 against 0.739;
//   docs/perf-log.md, session 32): 16-row boxes cost each 64-key tile a round of issue.
// Other head dims as decode.
constexpr int kShortTilePageRows = 32;  // pages of at most this many rows take 64-key tiles

constexpr int kShortKeysDense = 16384;  // dense caches of at most this many keys: 32 x 64 x 2

TileTable decode_tma_tiles(std::string_view arch, int head_dim, bool causal, bool paged) {
  if (head_dim != 128) return decode_tiles(arch, head_dim, causal, paged);
  const TileConfig rows_32 = {32, 64, paged ? 3 : 2};
  TileTable table;
  if (paged) {
    table.rules[0] = {INT_MAX, TileConfig{16, 64, 2}, 16, kShortTilePageRows};
    table.rules[1] = {INT_MAX, TileConfig{16, 128, 3}, 16};
  } else {
    table.rules[0] = {kShortKeysDense, rows_32, 16};
    table.rules[1] = {INT_MAX, TileConfig{16, 128, 2}, 16};
  }
  table.rules[2] = {INT_MAX, rows_32, 32};
  table.count = 3;
  if (paged) table.rules[table.count++] = {INT_MAX, TileConfig{64, 128, 3}, 64, kShortTilePageRows};
  table.rules[table.count++] = {INT_MAX, TileConfig{64, 64, 3}};
  return table;
}

// Row blocks times splits make the grid's x dimension (at most 2^31 - 1): 2^24 rows per KV head
// in tiles of 16 or more leave room for the most splits.
constexpr long long kMaxGridRowsPerKvHead = 1LL << 24;
static_assert(kMaxGridRowsPerKvHead / 16 * MergeShape::kMaxStates <= 0x7fffffffLL);

// Dense caches with many rows per KV head are prefill's. `exempt`: what the family takes anyway,
// at any row count (up to the grid's), spelled for the message.
std::string rows_beyond_decode(const ForwardProblem& problem, bool exempt, const char* unless) {
  if (problem.rows_per_kv_head() > kMaxGridRowsPerKvHead)
    return fmt::format("takes at most {} query rows per KV head (seqlen_q x heads_q / heads_kv; "
                       "its grid's limit), this problem has {}",
                       kMaxGridRowsPerKvHead, problem.rows_per_kv_head());
  if (exempt || problem.rows_per_kv_head() <= DecodeShape::kMaxRowsPerKvHead) return {};
  return fmt::format(
      "takes at most {} query rows per KV head (seqlen_q x heads_q / heads_kv) unless {}, this "
      "problem has {}",
      DecodeShape::kMaxRowsPerKvHead, unless, problem.rows_per_kv_head());
}

// Prefill-sized varlen, seqused_k and paged problems are the mma family's where it takes them
// (unsplit): its 128-row query tiles read each K/V tile once where these row blocks of 16 or 32
// read it again (H100, 16 causal sequences of 131-8037 tokens, d128: 10.3 ms against 19.7; 32 of
// 102-995, d64: 0.148 against 0.287; docs/perf-log.md, session 27; both kernels on an H200, 512
// causal queries x 4 heads per KV head over 8k keys in pages of 16, batch 8: d128 2.30 ms against
// 4.60, d64 1.23 against 2.36; d256 in pages of 64: 0.81 against 2.93, session 29).
std::string decode_unsupported(const ForwardProblem& problem) {
  const bool per_sequence = problem.per_sequence_lengths() || problem.paged;
  const bool mma_runs_it =
      per_sequence && problem.rows_per_kv_head() > DecodeShape::kMaxRowsPerKvHead &&
      why_family_cannot_take(family_named("mma", "family"), problem).empty();
  return rows_beyond_decode(problem, per_sequence && !mma_runs_it,
                            "paged, varlen or with seqused_k, and split (num_splits > 1)");
}

// K and V are read once: L2 fetches 128 bytes per miss, not 256 (512 -> 482 us on the batch-64
// decode case, docs/perf-log.md).
constexpr CUtensorMapL2promotion kStreamingPromotion = CU_TENSOR_MAP_L2_PROMOTION_L2_128B;

// K and V maps for the TMA kernel (boxes of 64 x rows: whole tiles, or page-sized runs), zeros
// for the cp.async one (its signature is the same; it never reads them).
void add_kv_maps(LaunchPlan& plan, const Variant& v, const ForwardProblem& problem) {
  if (!loads_with_tma(v)) {
    plan.maps.resize(2);
    return;
  }
  const FmhaParams& p = problem.params;
  // Rows and blocks of the map: pages, one packed varlen tensor, or one sequence per batch.
  const int rows = problem.paged    ? problem.page_size
                   : problem.varlen ? problem.total_k
                                    : problem.seqlen_k;
  const int blocks = problem.paged ? problem.num_pages : problem.varlen ? 1 : problem.batch;
  const int box_rows = problem.paged ? page_box_rows(problem.page_size, v.tile_n) : v.tile_n;
  plan.maps.push_back(tensor_map(MapOperand::k, p.k, problem.dtype, problem.head_dim, rows,
                                 problem.heads_kv, blocks, p.k_stride_s, p.k_stride_h, p.k_stride_b,
                                 box_rows, kStreamingPromotion));
  plan.maps.push_back(tensor_map(MapOperand::v, p.v, problem.dtype, problem.head_dim, rows,
                                 problem.heads_kv, blocks, p.v_stride_s, p.v_stride_h, p.v_stride_b,
                                 box_rows, kStreamingPromotion));
}

LaunchPlan decode_plan(const Variant& v, const ForwardProblem& problem, const DeviceInfo& device) {
  const int splits = decode_num_splits(v, problem, device);
  const int row_blocks = static_cast<int>((problem.rows_per_kv_head() + v.tile_m - 1) / v.tile_m);
  LaunchPlan plan;
  plan.grid = {static_cast<unsigned>(row_blocks * splits), static_cast<unsigned>(problem.heads_kv),
               static_cast<unsigned>(problem.batch)};
  plan.block = {static_cast<unsigned>(decode_shape(v).threads()), 1, 1};
  plan.shared_bytes = static_cast<unsigned>(decode_shared_bytes(v));
  add_kv_maps(plan, v, problem);
  return plan;
}

std::string decode_arguments(const Variant& v) {
  return fmt::format("{}, {}, {}, {}, {}, {}, {}, {}, {}, {}, {}", v.head_dim, v.tile_m, v.tile_n,
                     v.stages, v.causal, v.paged, loads_with_tma(v), v.softcap, v.window, v.sink,
                     v.alibi);
}

// 16-byte vectors per row must divide the 128 threads' copy passes.
constexpr int kDecodeHeadDims[] = {64, 128, 256};

// TMA boxes never cross a page, so a page size's lowest set bit bounds their rows
// (page_box_rows); below this many rows per box the cp.async kernel gathers faster.
// d128 has short-key tiles for small pages (decode_tma_tiles: pages of 16 at 499.9 us against
// 555); other head dims were measured only with their one tile (pages of 16 at 716 us against
// 538 for the cp.async kernel); boxes of 8 rows were not measured.
int min_tma_box_rows(int head_dim) { return head_dim == 128 ? 16 : 64; }

// TMA boxes need strides below 2^40 bytes and pages whose boxes have min_tma_box_rows or more;
// else the cp.async family runs it.
std::string decode_tma_unsupported(const ForwardProblem& problem) {
  const int min_box_rows = min_tma_box_rows(problem.head_dim);
  if (problem.paged && (problem.page_size & -problem.page_size) < min_box_rows)
    return fmt::format(
        "gathers pages of {} rows slower than decode: takes page sizes that are multiples of {}",
        problem.page_size, min_box_rows);
  const FmhaParams& p = problem.params;
  for (long long stride :
       {p.k_stride_b, p.k_stride_s, p.k_stride_h, p.v_stride_b, p.v_stride_s, p.v_stride_h})
    if (stride * 2 >= kMaxTmaStride)
      return fmt::format("a K/V stride of {} elements is past TMA's 2^40-byte limit", stride);
  // Prefill-shaped problems are the wgmma family's on Hopper: dense ones, with seqused_k or a
  // varlen batch, and paged ones where it reads their pages (its tiles load each K/V row once per
  // query tile of 128 rows, where these row blocks of 16 or 32 read them again).
  const bool wgmma_pages_it =
      problem.paged && problem.rows_per_kv_head() > DecodeShape::kMaxRowsPerKvHead &&
      why_family_cannot_take(family_named("wgmma", "family"), problem).empty();
  return rows_beyond_decode(problem, problem.paged && !wgmma_pages_it,
                            "paged in pages wgmma does not read, or split (num_splits > 1)");
}

bool runs_on_hopper(std::string_view arch) { return arch == "sm_90a"; }

// The two decode families: one kernel template, told apart by their names (decode_shape).
constexpr KernelFamily decode_family(std::string_view name, std::string_view summary,
                                     bool (*runs_on)(std::string_view),
                                     TileTable (*tiles)(std::string_view, int, bool, bool),
                                     std::string (*unsupported)(const ForwardProblem&)) {
  return {
      .role = FamilyRole::attention,
      .features = kFeatureUserFunctions | kFeaturePagedKv | kFeatureSeqUsedK | kFeatureSplitKv | kFeatureVarlen |
                  kFeatureSoftcap | kFeatureWindow | kFeatureSink | kFeatureAlibi,
      .name = name,
      .summary = summary,
      .source_file = "decode/kernel.cu",
      .kernel_template = "flashjit::fmha_decode_kernel",
      .head_dims = kDecodeHeadDims,
      .runs_on = runs_on,
      .check_tiles = decode_check,
      .shared_bytes = decode_shared_bytes,
      .tile_table = tiles,
      .unsupported_reason = unsupported,
      .plan = decode_plan,
      .template_arguments = decode_arguments,
      .num_splits = decode_num_splits,
  };
}

}  // namespace

// Hopper: the same kernel with TMA loads; first in the registry, so it wins where it runs.
constinit extern const KernelFamily kDecodeTmaFamily =
    decode_family("decode_tma", "split-KV decode as decode, with TMA loads (Hopper, sm_90a)",
                  runs_on_hopper, decode_tma_tiles, decode_tma_unsupported);

constinit extern const KernelFamily kDecodeFamily =
    decode_family("decode", "split-KV decode with GQA packing, dense or paged KV (mma.sync)",
                  runs_on_sm80_or_later, decode_tiles, decode_unsupported);

}  // namespace flashjit::detail

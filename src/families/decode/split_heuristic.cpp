#include "families/decode/split_heuristic.hpp"

#include <algorithm>

#include "decode/shape.cuh"
#include "merge/shape.cuh"

namespace flashjit::detail {
namespace {

// A CTA's cost beyond its key tiles, in tiles: its Q load and pipeline fill, and its share of the
// merge. Measured on the H200 (docs/perf-log.md, decode section).
constexpr double kFixedTilesPerCta = 2.0;
// A cap of 4 CTAs of one row group (128 threads) per SM. It is looser than the registers allow
// (the default variants take 80-245 a thread), but shared memory binds first for them.
constexpr int kMaxCtasPerSmByRegisters = 4;
constexpr int kReservedSharedPerCta = 1024;  // the driver keeps 1 KB per CTA

int ceil_div(long long a, long long b) { return static_cast<int>((a + b - 1) / b); }

}  // namespace

int decode_ctas_per_sm(const DecodeShape& shape, const DeviceInfo& device) {
  const int per_sm = device.max_shared_per_block_optin + kReservedSharedPerCta;
  return std::clamp(per_sm / (shape.shared_bytes() + kReservedSharedPerCta), 1,
                    std::max(kMaxCtasPerSmByRegisters / shape.row_groups(), 1));
}

int decode_num_splits(const Variant& v, const ForwardProblem& problem, const DeviceInfo& device) {
  if (problem.num_splits > 0) return problem.num_splits;
  const DecodeShape shape = decode_shape(v);
  const long long row_blocks = ceil_div(problem.rows_per_kv_head(), v.tile_m);
  const long long ctas = static_cast<long long>(problem.batch) * problem.heads_kv * row_blocks;
  const int tiles = std::max(1, problem.key_tiles_seen(v.tile_n));
  const long long slots = static_cast<long long>(std::max(device.multiprocessors, 1)) *
                          decode_ctas_per_sm(shape, device);
  int best = 1;
  double best_cost = 0;
  for (int splits = 1; splits <= std::min(MergeShape::kMaxStates, tiles); ++splits) {
    const long long waves = (ctas * splits + slots - 1) / slots;
    const double cost = static_cast<double>(waves) * (ceil_div(tiles, splits) + kFixedTilesPerCta);
    if (splits == 1 || cost < best_cost) best = splits, best_cost = cost;
  }
  return best;
}

}  // namespace flashjit::detail

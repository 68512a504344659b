#include "families/wgmma/schedule.hpp"

#include <algorithm>
#include <cstdint>

namespace flashjit::detail {
namespace {

// Plain dense causal launches of may_take_units' kernels, given the engine's tile counter: where
// the round-robin pairs leave SMs idle, the pairs from taken_from_pair on are taken tile by tile
// as CTAs free up, costliest first within groups of pairs (wgmma/schedule.cuh). Measured on an
// H100 (docs/perf-log.md, sessions 35-39): under two rounds, every pair's tiles (b3 h16
// 777 x 1531 d128, 1.45 rounds: +17 %, +7 % more once each tile was claimed as its CTA frees up;
// b2 h8 3001 d256 +4 %, then +16 %); with more rounds, d64's 192-row tiles (deals_before_taking)
// where 1/50 or more of the slots stay idle, from about a round before the end (b1 h32 16k
// +4.0 %, b2 h32 8k +3.6 %), which lost 5-12 % at d128 / d256 (every tile taken, 1-16 %; both
// measured while tiles were still claimed a tile early). A group's K and V fit half of L2, and
// the CTAs running at once hold min(m_tiles, 4) tiles or more of each of its pairs, which then
// read the pair's K/V in step.
void plan_taken_tiles(WgmmaSchedule& schedule, const ForwardProblem& problem,
                      const DeviceInfo& device, std::int64_t pairs, int tile_m) {
  constexpr std::int64_t kMinIdleShare = 50;
  const std::int64_t sms = device.multiprocessors, units = schedule.total_units;
  if (units >= 2 * sms) {
    const std::int64_t rounds = (units + sms - 1) / sms;
    if (!deals_before_taking(tile_m) || (rounds * sms - units) * kMinIdleShare < rounds * sms)
      return;
    const std::int64_t dealt_units = (units / sms - 1) * sms;
    schedule.taken_from_pair = static_cast<std::int32_t>(dealt_units / schedule.units_per_pair);
  }
  const std::int64_t taken_pairs = pairs - schedule.taken_from_pair;
  const std::int64_t kv_bytes_per_pair =
      std::max<std::int64_t>(std::int64_t{problem.seqlen_k} * problem.head_dim * 2 * 2, 1);
  const std::int64_t by_l2 =
      static_cast<std::int64_t>(device.l2_cache_bytes) / 2 / kv_bytes_per_pair;
  const std::int64_t by_residents = sms / std::clamp(schedule.m_tiles, 1, 4);
  schedule.lpt_group_pairs = static_cast<std::int32_t>(std::clamp<std::int64_t>(
      std::min(by_l2, by_residents), 1, std::max<std::int64_t>(taken_pairs, 1)));
}

}  // namespace

WgmmaLaunchSchedule wgmma_schedule(const Variant& v, const ForwardProblem& problem,
                                   const DeviceInfo& device) {
  WgmmaSchedule schedule{};
  // Varlen: seqlen_q and seqlen_k are the longest sequence's, so these bound the real schedule.
  schedule.m_tiles = (problem.seqlen_q + v.tile_m - 1) / v.tile_m;
  const std::int64_t pairs = std::int64_t{problem.batch} * problem.heads_q;
  const std::int64_t sms = device.multiprocessors;
  // Causal units pair the tile k with tile m_tiles - 1 - k of the same head (equal cost).
  schedule.units_per_pair = problem.causal ? (schedule.m_tiles + 1) / 2 : schedule.m_tiles;
  schedule.total_units = static_cast<std::int32_t>(schedule.units_per_pair * pairs);
  // (The family takes no problem whose 64-row tiles overflow an int, so single tiles fit one.)
  if (may_take_units(problem.causal, v.varlen, problem.paged,
                     v.softcap || v.window || v.sink || v.alibi || !v.user_functions.empty(),
                     v.head_dim, v.tile_m))
    plan_taken_tiles(schedule, problem, device, pairs, v.tile_m);
  schedule.sorted_varlen = v.varlen && problem.batch <= WgmmaGeometry::kMaxSortedSequences;
  schedule.gather_pages = problem.paged && wgmma_gathers_pages(problem.page_size);

  // Taken single tiles: one CTA an SM up to one a tile (round-robin pairs, where the engine has
  // no counter to give, leave the CTAs past their count idle).
  const bool takes_tile_counter = schedule.lpt_group_pairs > 0;
  const std::int64_t units =
      takes_tile_counter ? std::int64_t{schedule.taken_from_pair} * schedule.units_per_pair +
                               (pairs - schedule.taken_from_pair) * schedule.m_tiles
                         : schedule.total_units;
  return {schedule, static_cast<unsigned>(std::min(units, sms)), takes_tile_counter};
}

}  // namespace flashjit::detail

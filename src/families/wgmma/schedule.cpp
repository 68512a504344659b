#include "families/wgmma/schedule.hpp"

#include <algorithm>
#include <cstdint>

namespace flashjit::detail {

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
  // Plain dense causal (may_take_units), with the engine's tile counter, where the pairs take
  // under two rounds of the grid (the last one's idle SMs a large share): single tiles taken as
  // CTAs free up, costliest first within groups of pairs (wgmma/schedule.cuh). Measured on an
  // H100 (docs/perf-log.md, sessions 35-37): b3 h16 777 x 1531 d128 (1.45 rounds) +17 %, b2 h8
  // 3001 d256 +4 %; with more rounds single tiles lost 1-16 % to the pairs, and taking only the
  // tail's pairs tile by tile lost 5-12 % at d128 / d256. A group's K and V fit half of L2, and
  // the CTAs running at once hold min(m_tiles, 4) tiles or more of each of its pairs, which then
  // read the pair's K/V in step. (The family takes no problem whose 64-row tiles overflow an int,
  // so single tiles fit one.)
  const std::int64_t single_tiles = std::int64_t{schedule.m_tiles} * pairs;
  if (may_take_units(problem.causal, v.varlen, problem.paged,
                     v.softcap || v.window || v.sink || v.alibi || !v.user_functions.empty(),
                     v.head_dim, v.tile_m) &&
      schedule.total_units < 2 * sms) {
    const std::int64_t kv_bytes_per_pair =
        std::max<std::int64_t>(std::int64_t{problem.seqlen_k} * problem.head_dim * 2 * 2, 1);
    const std::int64_t by_l2 =
        static_cast<std::int64_t>(device.l2_cache_bytes) / 2 / kv_bytes_per_pair;
    const std::int64_t by_residents = sms / std::clamp(schedule.m_tiles, 1, 4);
    schedule.lpt_group_pairs = static_cast<std::int32_t>(std::clamp<std::int64_t>(
        std::min(by_l2, by_residents), 1, std::max<std::int64_t>(pairs, 1)));
  }
  schedule.sorted_varlen = v.varlen && problem.batch <= WgmmaGeometry::kMaxSortedSequences;
  schedule.gather_pages = problem.paged && wgmma_gathers_pages(problem.page_size);

  // Taken single tiles: one CTA an SM up to one a tile (round-robin pairs, where the engine has
  // no counter to give, leave the CTAs past their count idle).
  const bool takes_tile_counter = schedule.lpt_group_pairs > 0;
  const std::int64_t units = takes_tile_counter ? single_tiles : schedule.total_units;
  return {schedule, static_cast<unsigned>(std::min(units, sms)), takes_tile_counter};
}

}  // namespace flashjit::detail

// The wgmma family's launch schedule (families/wgmma/schedule.cpp), no GPU: which launches take
// single causal tiles from the engine's counter, in what groups, and on how many CTAs.
#include <doctest/doctest.h>

#include <cstdint>

#include "api/dispatch.hpp"
#include "api/validate.hpp"
#include "families/registry.hpp"
#include "families/wgmma/schedule.hpp"
#include "flashjit/flashjit.hpp"
#include "wgmma/shape.cuh"

using namespace flashjit;

namespace {

DeviceInfo h100() {
  DeviceInfo d;
  d.arch = "sm_90a";
  d.multiprocessors = 132;
  d.max_shared_per_block_optin = 227 * 1024;
  d.l2_cache_bytes = 50 * 1024 * 1024;
  return d;
}

struct Launch {
  Variant variant;
  detail::WgmmaLaunchSchedule walk;
};

// A bf16 BSHD forward on the wgmma family with the table's tiles.
Launch plan(int batch, int heads, int seqlen_q, int seqlen_k, int head_dim, bool causal,
            float softcap = 0.f) {
  const auto q = TensorView::bshd(reinterpret_cast<void*>(0x100000), DType::bf16, batch, seqlen_q,
                                  heads, head_dim);
  const auto kv = TensorView::bshd(reinterpret_cast<void*>(0x200000), DType::bf16, batch, seqlen_k,
                                   heads, head_dim);
  ForwardOptions options;
  options.causal = causal;
  options.softcap = softcap;
  const detail::ForwardProblem problem =
      detail::validate_forward(q, KVCache::dense(kv, kv), q, nullptr, options);
  const DeviceInfo gpu = h100();
  const Variant v = detail::select_variant(problem, gpu, detail::find_family("wgmma"));
  return {v, detail::wgmma_schedule(v, problem, gpu)};
}

}  // namespace

TEST_CASE("wgmma schedule: causal tiles taken from the counter only under two rounds of pairs") {
  // b3 h16 777 x 1531 d128: 7 tiles of 128 rows, 4 pairs of tiles (units) per head, 192 units
  // on 132 SMs (1.45 rounds): single tiles, one CTA an SM.
  const Launch short_batch = plan(3, 16, 777, 1531, 128, true);
  CHECK(short_batch.variant.tile_m == 128);
  CHECK(short_batch.walk.schedule.m_tiles == 7);
  CHECK(short_batch.walk.schedule.total_units == 4 * 48);
  CHECK(short_batch.walk.takes_tile_counter);
  CHECK(short_batch.walk.ctas == 132);
  // Groups: K and V of a head (1531 x 128 x 2 tensors x 2 bytes) 33 times in half of L2, and
  // 132 / 4 resident CTAs per group's 4+ tiles a head: 33 heads.
  CHECK(short_batch.walk.schedule.lpt_group_pairs == 33);

  // One head of 3 tiles: a CTA a tile, a group of the one head.
  const Launch one_head = plan(1, 1, 300, 300, 128, true);
  CHECK(one_head.walk.takes_tile_counter);
  CHECK(one_head.walk.ctas == 3);
  CHECK(one_head.walk.schedule.lpt_group_pairs == 1);

  // b2 h16 8k d128: 32 units a head, 1024 on 132 SMs: pairs dealt round-robin.
  const Launch long_batch = plan(2, 16, 8192, 8192, 128, true);
  CHECK_FALSE(long_batch.walk.takes_tile_counter);
  CHECK(long_batch.walk.schedule.lpt_group_pairs == 0);
  CHECK(long_batch.walk.ctas == 132);

  // b2 h8 3001 d256: 128 x 80 tiles, 24 tiles, 12 units a head, 192 units: taken.
  const Launch d256 = plan(2, 8, 3001, 3001, 256, true);
  CHECK(d256.variant.tile_m == 128);
  CHECK(d256.walk.takes_tile_counter);
}

TEST_CASE("wgmma schedule: d64's 192-row tiles deal pairs, then take the last round's tiles") {
  // b1 h32 16k d64: 86 tiles of 192 rows, 43 units a head, 1376 units in 10.4 rounds (5 % of
  // the slots idle): 9 rounds' units dealt (27 whole heads), the other 5 heads' 430 tiles taken,
  // in one group (4 MB of K and V a head: 6 fit half of L2).
  const Launch long_d64 = plan(1, 32, 16384, 16384, 64, true);
  CHECK(long_d64.variant.tile_m == 192);
  CHECK(long_d64.walk.takes_tile_counter);
  CHECK(long_d64.walk.schedule.taken_from_pair == 27);
  CHECK(long_d64.walk.schedule.lpt_group_pairs == 5);
  CHECK(long_d64.walk.ctas == 132);
  // b1 h33 4100 d64: 22 tiles, 11 units a head, 363 units in 3 rounds (8 % idle): a round dealt.
  const Launch three_rounds = plan(1, 33, 4100, 4100, 64, true);
  CHECK(three_rounds.walk.schedule.taken_from_pair == 12);
  CHECK(three_rounds.walk.takes_tile_counter);
  // b1 h36 4100 d64: 396 units, 3 full rounds: dealt.
  const Launch full_rounds = plan(1, 36, 4100, 4100, 64, true);
  CHECK_FALSE(full_rounds.walk.takes_tile_counter);
  CHECK(full_rounds.walk.schedule.taken_from_pair == 0);
  // d128 with an idle last round (b4 h16 2k: 8 units a head, 512 units, 3.9 rounds, 3 % idle)
  // over two rounds: dealt (taking its tail lost 5 %).
  const Launch d128 = plan(4, 16, 2048, 2048, 128, true);
  CHECK(d128.walk.schedule.total_units == 512);
  CHECK_FALSE(d128.walk.takes_tile_counter);
}

TEST_CASE("wgmma schedule: kernels without the counter's path never take") {
  // d64 in 128-row tiles (the counter's path cost that kernel 2-3 % where it deals), non-causal
  // (equal tiles), soft-capped (the score variants spilled with it): dealt, one CTA a unit at
  // most.
  const Launch d64 = plan(3, 16, 777, 1531, 64, true);
  CHECK_FALSE(d64.walk.takes_tile_counter);
  CHECK(d64.walk.ctas == 132);
  const Launch full = plan(3, 16, 777, 1531, 128, false);
  CHECK_FALSE(full.walk.takes_tile_counter);
  const Launch capped = plan(3, 16, 777, 1531, 128, true, 30.f);
  CHECK(capped.variant.softcap);
  CHECK_FALSE(capped.walk.takes_tile_counter);
  const Launch tiny = plan(1, 1, 300, 300, 64, true);
  CHECK(tiny.walk.ctas == 2);  // 3 tiles of 128 rows: 2 units

  // The rule the host and the kernels share (wgmma/shape.cuh).
  CHECK(may_take_units(true, false, false, false, 128, 128));
  CHECK(may_take_units(true, false, false, false, 256, 128));
  CHECK_FALSE(may_take_units(true, false, false, false, 64, 128));
  CHECK(may_take_units(true, false, false, false, 64, 192));
  CHECK_FALSE(may_take_units(true, false, false, false, 128, 64));
  CHECK_FALSE(may_take_units(false, false, false, false, 128, 128));
  CHECK_FALSE(may_take_units(true, true, false, false, 128, 128));  // varlen
  CHECK_FALSE(may_take_units(true, false, true, false, 128, 128));  // paged
  CHECK_FALSE(may_take_units(true, false, false, true, 128, 128));  // score variants
}

// The dispatcher's choice per arch and problem, and the launch shape of the query-tile families.
#include <doctest/doctest.h>

#include "dispatch.hpp"
#include "families.hpp"
#include "flashjit/flashjit.hpp"
#include "validate.hpp"

using namespace flashjit;

namespace {

DeviceInfo device_for(const char* arch, int shared_optin) {
  DeviceInfo d;
  d.arch = arch;
  d.max_shared_per_block_optin = shared_optin;
  return d;
}

detail::ForwardProblem problem(int head_dim, bool causal, int seqlen_q = 1000) {
  void* data = reinterpret_cast<void*>(0x100000);  // validation never dereferences
  const auto q = TensorView::bshd(data, DType::bf16, 2, seqlen_q, 8, head_dim);
  const auto kv = TensorView::bshd(data, DType::bf16, 2, 777, 2, head_dim);
  ForwardOptions options;
  options.causal = causal;
  return detail::validate_forward(q, kv, kv, q, options);
}

}  // namespace

TEST_CASE("Hopper gets wgmma where it has a kernel, mma elsewhere; older GPUs get mma") {
  const DeviceInfo h200 = device_for("sm_90a", 227 * 1024);
  CHECK(detail::select_variant(problem(128, true), h200, {}).family == Family::wgmma);
  CHECK(detail::select_variant(problem(64, false), h200, {}).family == Family::wgmma);
  CHECK(detail::select_variant(problem(96, false), h200, {}).family == Family::mma);
  const DeviceInfo rtx = device_for("sm_86", 99 * 1024);
  const Variant v = detail::select_variant(problem(256, true), rtx, {});
  CHECK(v.family == Family::mma);
  CHECK(v.arch == "sm_86");
  CHECK(v.causal);
  CHECK(detail::family_traits(v.family).shared_bytes(v) <= 99 * 1024);
}

TEST_CASE("a forced family that cannot run the problem is an unsupported error") {
  const DeviceInfo a100 = device_for("sm_80", 163 * 1024);
  CHECK(detail::select_variant(problem(128, false), a100, Family::simt).family == Family::simt);
  CHECK_THROWS_WITH_AS(detail::select_variant(problem(128, false), a100, Family::wgmma),
                       doctest::Contains("wgmma does not run on sm_80"), Error);
}

TEST_CASE("forced tiles replace the table's, and a shape the family cannot build is an error") {
  const DeviceInfo h200 = device_for("sm_90a", 227 * 1024);
  const Variant v = detail::select_variant(problem(128, false), h200, {}, TileConfig{128, 128, 3});
  CHECK(v.family == Family::wgmma);
  CHECK(v.tile_m == 128);
  CHECK(v.tile_n == 128);
  CHECK(v.stages == 3);
  CHECK_THROWS_WITH_AS(
      detail::select_variant(problem(128, false), h200, {}, TileConfig{96, 128, 2}),
      doctest::Contains("options.tiles (tile_m 96, tile_n 128, stages 2) for family wgmma"), Error);
  CHECK_THROWS_WITH_AS(
      detail::select_variant(problem(128, false), h200, Family::mma, TileConfig{128, 256, 4}),
      doctest::Contains("shared memory"), Error);
  try {
    detail::select_variant(problem(128, false), h200, {}, TileConfig{128, 100, 2});
    FAIL("expected an error");
  } catch (const Error& e) {
    CHECK(e.code() == ErrorCode::invalid_argument);
  }
}

TEST_CASE("simt and mma launch one CTA per (query tile, head, batch)") {
  const DeviceInfo h200 = device_for("sm_90a", 227 * 1024);
  for (Family family : {Family::simt, Family::mma}) {
    const auto p = problem(128, false, 1000);
    const Variant v = detail::select_variant(p, h200, family);
    const auto& traits = detail::family_traits(family);
    const detail::LaunchPlan plan = traits.plan(v, p);
    CHECK(plan.grid[0] == static_cast<unsigned>((1000 + v.tile_m - 1) / v.tile_m));
    CHECK(plan.grid[1] == 8u);
    CHECK(plan.grid[2] == 2u);
    CHECK(plan.block[0] == static_cast<unsigned>(traits.threads(v)));
    CHECK(plan.shared_bytes == static_cast<unsigned>(traits.shared_bytes(v)));
    CHECK(plan.extra_args.empty());
  }
}

// The dispatcher's choice per arch and problem, and the launch shape of the query-tile families.
#include <doctest/doctest.h>

#include "api/dispatch.hpp"
#include "api/launch_plans.hpp"
#include "api/validate.hpp"
#include "families/registry.hpp"
#include "flashjit/flashjit.hpp"
#include "mma/shape.cuh"
#include "simt/shape.cuh"

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

const detail::KernelFamily* family(const char* name) {
  return &detail::family_named(name, "family");
}

}  // namespace

TEST_CASE("Hopper gets wgmma where it has a kernel, mma elsewhere; older GPUs get mma") {
  const DeviceInfo h200 = device_for("sm_90a", 227 * 1024);
  CHECK(detail::select_variant(problem(128, true), h200, {}).family == "wgmma");
  CHECK(detail::select_variant(problem(64, false), h200, {}).family == "wgmma");
  CHECK(detail::select_variant(problem(96, false), h200, {}).family == "mma");
  const DeviceInfo rtx = device_for("sm_86", 99 * 1024);
  const Variant v = detail::select_variant(problem(256, true), rtx, {});
  CHECK(v.family == "mma");
  CHECK(v.arch == "sm_86");
  CHECK(v.causal);
  CHECK(family("mma")->shared_bytes(v) <= 99 * 1024);
}

TEST_CASE("a forced family that cannot run the problem is an unsupported error") {
  const DeviceInfo a100 = device_for("sm_80", 163 * 1024);
  CHECK(detail::select_variant(problem(128, false), a100, family("simt")).family == "simt");
  CHECK_THROWS_WITH_AS(detail::select_variant(problem(128, false), a100, family("wgmma")),
                       doctest::Contains("wgmma does not run on sm_80"), Error);
}

TEST_CASE("forced tiles replace the table's, and a shape the family cannot build is an error") {
  const DeviceInfo h200 = device_for("sm_90a", 227 * 1024);
  const Variant v = detail::select_variant(problem(128, false), h200, {}, TileConfig{128, 128, 3});
  CHECK(v.family == "wgmma");
  CHECK(v.tile_m == 128);
  CHECK(v.tile_n == 128);
  CHECK(v.stages == 3);
  CHECK_THROWS_WITH_AS(
      detail::select_variant(problem(128, false), h200, {}, TileConfig{96, 128, 2}),
      doctest::Contains("options.tiles (tile_m 96, tile_n 128, stages 2) for family wgmma"), Error);
  CHECK_THROWS_WITH_AS(
      detail::select_variant(problem(128, false), h200, family("mma"), TileConfig{128, 256, 4}),
      doctest::Contains("shared memory"), Error);
  try {
    detail::select_variant(problem(128, false), h200, {}, TileConfig{128, 100, 2});
    FAIL("expected an error");
  } catch (const Error& e) {
    CHECK(e.code() == ErrorCode::invalid_argument);
  }
}

TEST_CASE("simt and mma launch one CTA per (query tile, head, batch), shaped by their shape.cuh") {
  const DeviceInfo h200 = device_for("sm_90a", 227 * 1024);
  for (const char* name : {"simt", "mma"}) {
    const auto p = problem(128, false, 1000);
    const Variant v = detail::select_variant(p, h200, family(name));
    const detail::LaunchPlan plan = family(name)->plan(v, p, h200);
    const int threads = v.family == "simt" ? SimtShape{v.head_dim, v.tile_m, v.tile_n}.threads()
                                           : MmaShape::kThreads;
    CHECK(plan.grid[0] == static_cast<unsigned>((1000 + v.tile_m - 1) / v.tile_m));
    CHECK(plan.grid[1] == 8u);
    CHECK(plan.grid[2] == 2u);
    CHECK(plan.block[0] == static_cast<unsigned>(threads));
    CHECK(plan.shared_bytes == static_cast<unsigned>(family(name)->shared_bytes(v)));
    CHECK(plan.maps.empty());
    CHECK(plan.values.empty());
  }
}

TEST_CASE("an unknown forced family names the families there are") {
  CHECK_THROWS_WITH_AS(detail::forced_family(std::string("tensor")),
                       doctest::Contains("options.family 'tensor' is unknown: expected one of "
                                         "decode_tma, wgmma, decode, mma, simt, merge"),
                       Error);
  CHECK(detail::forced_family(std::nullopt) == nullptr);
}

TEST_CASE("launch plans are keyed by every size, stride and option, and by no pointer") {
  const auto base = problem(128, true);
  const auto key = detail::PlanKey::of(nullptr, base, nullptr, std::nullopt);
  CHECK(detail::PlanKey::of(nullptr, base, nullptr, std::nullopt) == key);

  detail::ForwardProblem moved = base;  // other buffers, same shape: the same plan
  moved.params.q = reinterpret_cast<void*>(0x200000);
  moved.params.lse = reinterpret_cast<float*>(0x300000);
  moved.params.softmax_scale = 0.5f;
  CHECK(detail::PlanKey::of(nullptr, moved, nullptr, std::nullopt) == key);

  // Soft-capping runs other kernels; the cap's value is a run-time parameter.
  detail::ForwardProblem capped = base;
  capped.softcap = 30.f;
  const auto capped_key = detail::PlanKey::of(nullptr, capped, nullptr, std::nullopt);
  CHECK_FALSE(capped_key == key);
  capped.softcap = 50.f;
  CHECK(detail::PlanKey::of(nullptr, capped, nullptr, std::nullopt) == capped_key);
  // So does a sliding window. Its sides and sink tokens are run-time parameters, but split-KV's
  // plan counts the key tiles they span (ForwardProblem::key_tiles_seen): they key plans too.
  detail::ForwardProblem windowed = base;
  windowed.window = true;
  windowed.params.window_left = 64;
  const auto windowed_key = detail::PlanKey::of(nullptr, windowed, nullptr, std::nullopt);
  CHECK_FALSE(windowed_key == key);
  CHECK(detail::PlanKey::of(nullptr, windowed, nullptr, std::nullopt) == windowed_key);
  for (auto side : {&FmhaParams::window_left, &FmhaParams::window_right,
                    &FmhaParams::sink_tokens}) {
    detail::ForwardProblem changed = windowed;
    changed.params.*side += 100;
    CHECK_FALSE(detail::PlanKey::of(nullptr, changed, nullptr, std::nullopt) == windowed_key);
  }
  // And attention sinks; their logits are a run-time parameter (a pointer, like the others).
  detail::ForwardProblem sunk = base;
  sunk.sink = true;
  sunk.params.sink_logits = reinterpret_cast<const float*>(0x500000);
  const auto sunk_key = detail::PlanKey::of(nullptr, sunk, nullptr, std::nullopt);
  CHECK_FALSE(sunk_key == key);
  CHECK_FALSE(sunk_key == windowed_key);
  sunk.params.sink_logits = reinterpret_cast<const float*>(0x600000);
  CHECK(detail::PlanKey::of(nullptr, sunk, nullptr, std::nullopt) == sunk_key);
  // And ALiBi; its slopes are a run-time parameter too.
  detail::ForwardProblem biased = base;
  biased.alibi = true;
  biased.params.alibi_slopes = reinterpret_cast<const float*>(0x700000);
  const auto biased_key = detail::PlanKey::of(nullptr, biased, nullptr, std::nullopt);
  CHECK_FALSE(biased_key == key);
  CHECK_FALSE(biased_key == sunk_key);
  biased.params.alibi_slopes = reinterpret_cast<const float*>(0x800000);
  CHECK(detail::PlanKey::of(nullptr, biased, nullptr, std::nullopt) == biased_key);

  detail::ForwardProblem strided = base;
  strided.params.k_stride_s *= 2;
  CHECK_FALSE(detail::PlanKey::of(nullptr, strided, nullptr, std::nullopt) == key);
  CHECK_FALSE(detail::PlanKey::of(nullptr, problem(128, false), nullptr, std::nullopt) == key);
  CHECK_FALSE(detail::PlanKey::of(nullptr, problem(128, true, 999), nullptr, std::nullopt) == key);
  CHECK_FALSE(detail::PlanKey::of(nullptr, base, family("mma"), std::nullopt) == key);
  CHECK_FALSE(detail::PlanKey::of(nullptr, base, nullptr, TileConfig{128, 128, 2}) == key);
  CHECK_FALSE(detail::PlanKey::of(reinterpret_cast<CUcontext>(0x10), base, nullptr, std::nullopt) ==
              key);
}

TEST_CASE("causal ALiBi variants reserve ALiBi's k16 slices where they fit shared memory") {
  const auto bytes = [](const char* name) {
    return family("wgmma")->shared_bytes(Variant::parse(name));
  };
  // d128 128 x 176: a 32-byte row per query row and per key (AlibiSlices), 256-byte aligned.
  const int plain = bytes("wgmma.sm90a.bf16.d128.m128n176s2.causal");
  const int alibi = bytes("wgmma.sm90a.bf16.d128.m128n176s2.causal.alibi");
  CHECK(alibi - plain >= (128 + 176) * 32);
  CHECK(alibi - plain < (128 + 176) * 32 + 256);
  CHECK(alibi <= 227 * 1024);
  // d256 128 x 80 has no room: the FFMA path, no slices.
  CHECK(bytes("wgmma.sm90a.bf16.d256.m128n80s2.causal.alibi") ==
        bytes("wgmma.sm90a.bf16.d256.m128n80s2.causal"));
  // Not causal (the bias is not rank one), or soft-capped (the cap comes first): no slices.
  CHECK(bytes("wgmma.sm90a.bf16.d128.m128n176s2.alibi") ==
        bytes("wgmma.sm90a.bf16.d128.m128n176s2"));
  CHECK(bytes("wgmma.sm90a.bf16.d128.m128n176s2.causal.softcap.alibi") ==
        bytes("wgmma.sm90a.bf16.d128.m128n176s2.causal.softcap"));
}

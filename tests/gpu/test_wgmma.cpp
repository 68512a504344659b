// The Hopper family (wgmma) beyond the shared forward suite: a persistent grid with more query
// tiles than SMs (each CTA loops, the K/V ring wraps across tiles), repeatable bits (no races
// between producer and consumers), and the dispatcher falling back for head dims it lacks.
#include <doctest/doctest.h>
#include <fmt/format.h>

#include <random>
#include <vector>

#include "flashjit/device_memory.hpp"
#include "forward_case.hpp"
#include "gpu.hpp"
#include "reference.hpp"

using namespace flashjit;
using namespace flashjit::test;

namespace {

bool on_hopper() { return shared_engine().device().arch == "sm_90a"; }

void check_case(const ForwardCase& c, unsigned seed) {
  const ForwardCheck check = run_forward_case(shared_engine(), c, "wgmma", seed);
  INFO(check.variant, " on ", c.describe());
  INFO("max abs ", check.max_abs_error, ", rel l2 ", check.relative_l2_error, ", lse ",
       check.max_lse_error);
  CHECK(check.variant.rfind("wgmma.", 0) == 0);
  CHECK(check.all_written);
  CHECK(check.max_abs_error <= max_abs_tolerance(c.dtype));
  CHECK(check.relative_l2_error <= relative_tolerance(c.dtype));
  CHECK(check.max_lse_error <= 1e-2);
  MESSAGE(fmt::format("{:<45} {:<40} max_abs {:.2e} rel {:.2e}", check.variant, c.describe(),
                      check.max_abs_error, check.relative_l2_error));
}

}  // namespace

TEST_CASE("wgmma: a persistent grid with more query tiles than SMs matches the reference") {
  if (!on_hopper()) {
    MESSAGE("not an sm_90a GPU: wgmma tests not run");
    return;
  }
  // More (batch, head) pairs than SMs, so every CTA loops over tiles; few query rows each (the
  // float64 reference is slow) but several K/V tiles, so the stage ring wraps across tiles.
  unsigned seed = 600;
  check_case({2, 72, 8, 40, 300, 64, false}, seed++);
  check_case({2, 70, 14, 33, 260, 128, true}, seed++);
  check_case({1, 136, 136, 20, 200, 256, false}, seed++);
  check_case({1, 136, 34, 200, 200, 64, true}, seed++);  // causal work units of two tiles
  // seqlen_q > seqlen_k, causal: the first query tiles see no key at all and are skipped.
  ForwardCase fp16{1, 64, 16, 300, 100, 128, true, DType::fp16, true};
  check_case(fp16, seed++);
}

TEST_CASE("wgmma: every default variant, forced onto ragged problems, matches the reference") {
  if (!on_hopper()) {
    MESSAGE("not an sm_90a GPU: wgmma tests not run");
    return;
  }
  // The tile table is keyed on seqlen_k, so small problems alone would never reach the shapes
  // chosen for long sequences: force each default variant's tiles instead.
  unsigned seed = 700;
  for (const Variant& v : default_variants("sm_90a")) {
    // Varlen variants run on varlen batches and seqused_k (test_varlen.cpp, test_decode.cpp),
    // paged ones over paged caches (test_decode.cpp's paged prefill): a dense problem takes the
    // dense variant of the same tiles.
    if (v.family != "wgmma" || v.varlen || v.paged) continue;
    const TileConfig tiles{v.tile_m, v.tile_n, v.stages};
    // Small enough for the float64 reference (40 cases), ragged on both sides, GQA, both layouts.
    for (const ForwardCase& c : {ForwardCase{1, 2, 1, 333, 517, v.head_dim, v.causal, v.dtype},
                                 ForwardCase{1, 1, 1, 520, 200, v.head_dim, v.causal, v.dtype,
                                             true}}) {
      const ForwardCheck check = run_forward_case(shared_engine(), c, "wgmma", seed++, tiles);
      INFO(check.variant, " on ", c.describe());
      CHECK(check.variant == v.name());
      CHECK(check.all_written);
      check_within_bounds(check, c.dtype);
    }
  }
}

TEST_CASE("wgmma: repeated runs give identical bits") {
  if (!on_hopper()) {
    MESSAGE("not an sm_90a GPU: wgmma tests not run");
    return;
  }
  Engine& engine = shared_engine();
  for (int head_dim : {64, 128, 256}) {
    const int b = 2, s = 777, h = 2048 / head_dim;
    HostTensor q = HostTensor::make(DType::bf16, b, s, h, head_dim, false);
    std::mt19937 rng(head_dim);
    DeviceBuffer dq(engine, q.bits.size() * 2), dk(engine, q.bits.size() * 2),
        dv(engine, q.bits.size() * 2), dout(engine, q.bits.size() * 2);
    for (DeviceBuffer* buffer : {&dq, &dk, &dv}) {
      q.fill_random(rng);
      buffer->upload(q.bits.data(), q.bits.size() * 2);
    }
    auto view = [&](const DeviceBuffer& buffer) {
      TensorView v = q.view;
      v.data = buffer.data();
      return v;
    };
    ForwardOptions options;
    options.causal = true;
    options.family = "wgmma";
    std::vector<std::uint16_t> first(q.bits.size()), again(q.bits.size());
    for (int run = 0; run < 3; ++run) {
      dout.fill_bytes(0xff);
      engine.forward(view(dq), view(dk), view(dv), view(dout), options);
      synchronize(engine);
      dout.download((run == 0 ? first : again).data(), q.bits.size() * 2);
      if (run > 0) CHECK_MESSAGE(first == again, "head_dim ", head_dim, " run ", run);
    }
  }
}

TEST_CASE("wgmma: head dims it lacks fall back to another family") {
  if (!on_hopper()) {
    MESSAGE("not an sm_90a GPU: wgmma tests not run");
    return;
  }
  Engine& engine = shared_engine();
  DeviceBuffer buffer(engine, 96 * 128 * 2);
  const TensorView t = TensorView::bshd(buffer.data(), DType::bf16, 1, 16, 4, 96);
  CHECK(engine.select_variant(t, t, t, t).family != "wgmma");
  ForwardOptions forced;
  forced.family = "wgmma";
  try {
    engine.select_variant(t, t, t, t, forced);
    FAIL("wgmma accepted head_dim 96");
  } catch (const Error& e) {
    CHECK(e.code() == ErrorCode::unsupported);
  }
  // 96 query rows per KV head: past what the decode family takes, so wgmma's.
  const TensorView t128 = TensorView::bshd(buffer.data(), DType::bf16, 1, 96, 1, 128);
  CHECK(engine.select_variant(t128, t128, t128, t128).family == "wgmma");
}

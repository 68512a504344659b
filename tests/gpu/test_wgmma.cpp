// The Hopper family (wgmma) beyond the shared forward suite: a persistent grid with more query
// tiles than SMs (each CTA loops, the K/V ring wraps across tiles), repeatable bits (no races
// between producer and consumers), and the dispatcher falling back for head dims it lacks.
#include <doctest/doctest.h>
#include <fmt/format.h>

#include <random>
#include <vector>

#include "cuda_graph.hpp"
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

// Random bf16 q, k and v of one shape [b, s, h, d] on the device, and causal wgmma forwards of
// them into outputs of that shape, whose bits the tests compare.
struct CausalInputs {
  Engine& engine;
  HostTensor host;
  std::size_t bytes;
  DeviceBuffer q, k, v;
  ForwardOptions options;

  CausalInputs(Engine& e, int b, int s, int h, int head_dim, unsigned seed)
      : engine(e),
        host(HostTensor::make(DType::bf16, b, s, h, head_dim, false)),
        bytes(host.bits.size() * 2),
        q(e, bytes),
        k(e, bytes),
        v(e, bytes) {
    std::mt19937 rng(seed);
    for (DeviceBuffer* buffer : {&q, &k, &v}) {
      host.fill_random(rng);
      buffer->upload(host.bits.data(), bytes);
    }
    options.causal = true;
    options.family = "wgmma";
  }
  TensorView view(const DeviceBuffer& buffer) const {
    TensorView t = host.view;
    t.data = buffer.data();
    return t;
  }
  void forward(const DeviceBuffer& out, CUstream_st* stream = nullptr) {
    engine.forward(view(q), view(k), view(v), view(out), options, stream);
  }
  std::vector<std::uint16_t> bits_of(const DeviceBuffer& out) const {
    std::vector<std::uint16_t> got(host.bits.size());
    out.download(got.data(), bytes);
    return got;
  }
};

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
  // Causal units are single tiles, costliest first within groups of pairs, taken as CTAs free
  // up (WgmmaSchedule::lpt_group_pairs; 128-row tiles only): 7 heads x 33 tiles (231 units on
  // at most 132 CTAs), most tiles seeing no key.
  check_case({1, 7, 1, 4100, 300, 128, true}, seed++);
  // Over two rounds of pairs (140 pairs of 600 rows: two or three units each): pairs dealt
  // round-robin in each role, no counter taken.
  check_case({2, 70, 14, 600, 600, 64, true}, seed++);
  // d64's 192-row tiles (from 4096 keys), 2 tiles x 8 pairs: every tile taken.
  check_case({1, 8, 2, 300, 4100, 64, true}, seed++);
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
    CausalInputs in(engine, 2, 777, 2048 / head_dim, head_dim, head_dim);
    DeviceBuffer out(engine, in.bytes);
    std::vector<std::uint16_t> first;
    for (int run = 0; run < 3; ++run) {
      out.fill_bytes(0xff);
      in.forward(out);
      synchronize(engine);
      if (run == 0)
        first = in.bits_of(out);
      else
        CHECK_MESSAGE(in.bits_of(out) == first, "head_dim ", head_dim, " run ", run);
    }
  }
}

TEST_CASE("wgmma: causal tiles taken from a stream's counter: back to back, two streams, a graph") {
  if (!on_hopper()) {
    MESSAGE("not an sm_90a GPU: wgmma tests not run");
    return;
  }
  // Dense causal launches take their tiles from a counter per stream that each launch leaves
  // zero; a forward captured into a CUDA graph gets none (a graph may run alongside itself) and
  // runs the round-robin order. Every order computes each tile the same way: the same bits as
  // the first run, or a counter left wrong (tiles skipped, poison kept) shows.
  struct Shape {
    int b, s, h, head_dim;
    bool reference;  // also against the float64 reference (the others: too slow on the host)
  };
  // d128: 8 tiles x 32 pairs, 128 units on 132 CTAs: every tile taken. d64 (192-row tiles from
  // 4096 keys): 22 tiles x 30 pairs, 330 units in 3 rounds: 12 pairs dealt, 396 tiles taken.
  for (const Shape shape : {Shape{2, 1000, 16, 128, true}, Shape{1, 4100, 30, 64, false}}) {
    CAPTURE(shape.head_dim);
    Engine& engine = shared_engine();
    CausalInputs in(engine, shape.b, shape.s, shape.h, shape.head_dim, 35);
    DeviceBuffer out(engine, in.bytes);
    out.fill_bytes(0xff);
    in.forward(out);
    synchronize(engine);
    const std::vector<std::uint16_t> first = in.bits_of(out);
    if (shape.reference) {
      const ForwardCheck reference = run_forward_case(
          engine, {shape.b, shape.h, shape.h, shape.s, shape.s, shape.head_dim, true}, "wgmma",
          3500);
      CHECK(reference.all_written);
      CHECK(reference.relative_l2_error <= relative_tolerance(DType::bf16));
    }

    // Back to back on each stream, the streams side by side, each launch into an output of its
    // own.
    Stream one(engine), two(engine);
    std::vector<DeviceBuffer> outs;
    for (int i = 0; i < 6; ++i) outs.emplace_back(engine, in.bytes);
    for (int run = 0; run < 3; ++run) {
      CAPTURE(run);
      for (DeviceBuffer& o : outs) o.fill_bytes(0xff);
      for (int i = 0; i < 6; i += 2) {
        in.forward(outs[i], one.get());
        in.forward(outs[i + 1], two.get());
      }
      one.synchronize();
      two.synchronize();
      for (int i = 0; i < 6; ++i) CHECK_MESSAGE(in.bits_of(outs[i]) == first, "launch ", i);
    }

    // Captured on a stream with a counter and on a new one: replays on both streams.
    const Stream fresh(engine);
    for (CUstream_st* captured_on : {one.get(), fresh.get()}) {
      out.fill_bytes(0xff);
      const CudaGraph graph(engine.context(), captured_on, [&] { in.forward(out, captured_on); });
      for (const Stream* replay_on : {&one, &two}) {
        graph.launch(replay_on->get());
        replay_on->synchronize();
        CHECK(in.bits_of(out) == first);
        out.fill_bytes(0xff);
      }
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

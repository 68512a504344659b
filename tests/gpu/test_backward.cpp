// Engine::backward on the GPU, for every dK/dV family that runs on it, against the float64
// reference gradients: as training calls it (forward with LSE, then backward from dout).
#include <doctest/doctest.h>
#include <fmt/format.h>

#include <algorithm>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "backward_case.hpp"
#include "cuda_graph.hpp"
#include "flashjit/device_memory.hpp"
#include "gpu.hpp"
#include "serving_checks.hpp"  // all_poison

using namespace flashjit;
using namespace flashjit::test;

namespace {

Engine& engine() { return shared_engine(); }

// The dK/dV families on this GPU. Every GPU this suite runs on is sm_80 or later, where bwd_mma
// runs, so an empty list is a failure, not a skip.
std::vector<std::string> families_here() {
  std::vector<std::string> names = backward_family_names();
  CHECK_MESSAGE(!names.empty(),
                fmt::format("no backward dK/dV family runs on {}", engine().device().arch));
  return names;
}

// Each case in each family on this GPU (or only `only_family`): within the bounds, the forced
// family's variant, one log line with the errors (what the bounds are tuned from). Seeds count up
// from `seed`.
void check_cases(const std::vector<BackwardCase>& cases, unsigned seed,
                 const std::string& only_family = {}) {
  for (const std::string& family : families_here())
    for (const BackwardCase& c : cases) {
      if (!only_family.empty() && family != only_family) continue;
      CAPTURE(family);
      CAPTURE(c.describe());
      if (!family_has_head_dim(family, c.head_dim)) {
        MESSAGE(fmt::format("{} has no head_dim {}: not run", family, c.head_dim));
        continue;
      }
      if (c.deterministic && family == "bwd_wgmma_fused") continue;  // refused (CPU tests)
      try {
        const BackwardCheck check = run_backward_case(engine(), c, family, seed++);
        CAPTURE(check.variant);
        CHECK(check.variant.starts_with(family + "."));
        if (c.tiles)
          CHECK(check.variant.find(fmt::format(".m{}n{}s{}", c.tiles->tile_m, c.tiles->tile_n,
                                               c.tiles->stages)) != std::string::npos);
        check_within_bounds(check, c.dtype);
        MESSAGE(fmt::format("{:<40} {:<42} {}", check.variant, c.describe(), describe(check)));
      } catch (const Error& e) {
        FAIL_CHECK(std::string(e.what()));
      }
    }
}

// Two runs' gradients bitwise equal (dq only when asked: the default mode sums it by atomics).
void check_same_bits(const BackwardProblem::Gradients& a, const BackwardProblem::Gradients& b,
                     bool dq_too) {
  if (dq_too) CHECK_MESSAGE(a.dq.bits == b.dq.bits, "dq differs bitwise");
  CHECK_MESSAGE(a.dk.bits == b.dk.bits, "dk differs bitwise");
  CHECK_MESSAGE(a.dv.bits == b.dv.bits, "dv differs bitwise");
}

void check_all_poison(const BackwardProblem::Gradients& g) {
  CHECK_MESSAGE(all_poison(g.dq), "dq was written");
  CHECK_MESSAGE(all_poison(g.dk), "dk was written");
  CHECK_MESSAGE(all_poison(g.dv), "dv was written");
}

// `call` throws Error(invalid_argument) whose message mentions `mentions` (when not empty).
template <typename Call>
void check_invalid_argument(const char* what, Call&& call, std::string_view mentions = {}) {
  CAPTURE(what);
  try {
    call();
    FAIL_CHECK("no error thrown");
  } catch (const Error& e) {
    CAPTURE(e.what());
    CHECK(e.code() == ErrorCode::invalid_argument);
    if (!mentions.empty()) CHECK(std::string_view(e.what()).find(mentions) != std::string::npos);
  }
}

// Engine::backward's arguments for a problem, to spoil one at a time.
struct BackwardArgs {
  explicit BackwardArgs(const BackwardProblem& p)
      : q(p.q()),
        k(p.k()),
        v(p.v()),
        out(p.out()),
        dout(p.dout()),
        lse(p.lse()),
        dq(p.dq()),
        dk(p.dk()),
        dv(p.dv()),
        options(p.options()) {}
  void run() const { engine().backward(q, k, v, out, dout, lse, dq, dk, dv, options); }

  TensorView q, k, v, out, dout;
  const float* lse;
  TensorView dq, dk, dv;
  BackwardOptions options;
};

}  // namespace

TEST_CASE("backward matches the float64 reference: every head dim, causal or not, around tiles") {
  // A single token; lengths at, under and over a 64-row tile and over a 128-row one (the tiles
  // are 32 to 128 rows and keys); several whole tiles and a ragged last one.
  std::vector<BackwardCase> cases;
  for (int d : {32, 64, 96, 128, 192, 256})
    for (bool causal : {false, true})
      for (int s : {1, 63, 64, 65, 129, 200, 384}) cases.push_back({1, 2, 2, s, s, d, causal});
  check_cases(cases, 100);
}

TEST_CASE("backward: seqlen_q != seqlen_k both ways; rows that see no key get zero gradients") {
  std::vector<BackwardCase> cases;
  for (bool causal : {false, true}) {
    cases.push_back({1, 2, 2, 77, 300, 128, causal});
    cases.push_back({1, 2, 2, 1, 513, 64, causal});  // one query (decode-shaped)
    // sq > sk, causal: rows 0 .. sq - sk - 1 sit before key 0 and see nothing: exact zeros in dq,
    // nothing added to dk and dv, never NaN (their LSE is -inf).
    cases.push_back({1, 2, 2, 300, 77, 64, causal});
    cases.push_back({1, 2, 2, 150, 70, 256, causal});
  }
  cases.push_back({2, 2, 1, 200, 1, 128, true});  // only the last row sees the one key
  check_cases(cases, 200);
}

TEST_CASE("backward: more key tiles than SMs, a persistent grid's CTAs taking several each") {
  // 144 to 264 key tiles (of 64 or 128 keys): past the 132 SMs of an H100/H200, so the Hopper
  // kernels' persistent grids walk several tiles in some CTAs (BwdKeyTileWalk): dealt where not
  // causal, taken from the workspace's counter where causal (key tiles of 1 to 11 query steps);
  // ragged last tiles.
  check_cases({{2, 40, 40, 256, 256, 64, false},
               {2, 48, 48, 200, 200, 128, true},
               {1, 16, 16, 1100, 1100, 64, true},
               {2, 12, 12, 700, 700, 256, true},
               {2, 24, 24, 256, 256, 256, false}},
              800);
}

TEST_CASE("backward: GQA and MQA sum dk and dv over each group of query heads") {
  check_cases({{2, 8, 2, 150, 150, 128, false},  // 4:1
               {1, 16, 2, 100, 140, 64, true},   // 8:1
               {1, 8, 1, 129, 257, 64, true},    // MQA
               {1, 4, 1, 96, 130, 256, true},    // MQA at the largest head dim
               {1, 6, 3, 70, 70, 96, false}},    // 2:1
              300);
}

TEST_CASE("backward: BHSD layout, fp16 at every head dim, batch > 1, an explicit scale") {
  std::vector<BackwardCase> cases;
  cases.push_back({2, 4, 2, 190, 211, 128, true, DType::bf16, true});
  bool causal = false;
  for (int d : {32, 64, 96, 128, 192, 256}) {
    cases.push_back({2, 2, 1, 130, 130, d, causal, DType::fp16});
    causal = !causal;
  }
  cases.push_back({1, 4, 2, 100, 333, 128, false, DType::fp16, true});
  cases.push_back({3, 2, 2, 64, 96, 64, true, DType::bf16, false, 0.3f});
  cases.push_back({1, 2, 2, 100, 100, 32, false, DType::fp16, true, 0.5f});
  check_cases(cases, 400);
}

TEST_CASE("backward of the score variants: softcap, windows, sink tokens, ALiBi, learnable sinks") {
  // Each variant alone and all at once, at every Hopper head dim, causal or not, in both modes
  // (the deterministic one runs the dQ kernels' variants); windows narrow enough that whole query
  // tiles of a key tile (and key tiles of a query tile) are skipped, rows a window leaves empty
  // (sq > sk, left edge), a sink that dominates some rows' softmax (logit 0.75 against scores of
  // ~N(0, 1)), and soft-caps that bend most scores.
  std::vector<BackwardCase> cases;
  for (int d : {64, 128, 256})
    for (bool causal : {false, true}) {
      BackwardCase capped{1, 2, 1, 200, 200, d, causal};
      capped.softcap = 1.5f;
      cases.push_back(capped);
      BackwardCase window{1, 2, 2, 333, 333, d, causal};
      window.window_left = 70;
      window.window_right = causal ? 0 : 30;
      cases.push_back(window);
      BackwardCase streaming = window;  // StreamingLLM: the first keys besides the band
      streaming.sink_tokens = 5;
      streaming.seqlen_q = 150;
      cases.push_back(streaming);
      BackwardCase alibi{1, 4, 2, 190, 260, d, causal};
      alibi.alibi = true;
      cases.push_back(alibi);
      BackwardCase sinks{2, 4, 1, 130, 130, d, causal};
      sinks.sinks = true;
      cases.push_back(sinks);
      BackwardCase all{1, 8, 2, 260, 180, d, causal, DType::fp16};  // sq > sk: empty rows
      all.softcap = 4.f;
      all.window_left = 40;
      all.window_right = causal ? 0 : 10;
      all.sink_tokens = 3;
      all.alibi = true;
      all.sinks = true;
      cases.push_back(all);
    }
  const std::size_t plain = cases.size();
  for (std::size_t i = 0; i < plain; i += 5) {  // the deterministic mode's dQ kernels
    BackwardCase c = cases[i];
    c.deterministic = true;
    cases.push_back(c);
  }
  check_cases(cases, 460);
}

TEST_CASE("backward: the dK/dV tile shapes of smaller GPUs, forced on this one") {
  // The tile table's (src/families/bwd_mma/tiles.cpp) 163 KB and 99 KB classes (A100,
  // consumer parts) where they differ from Hopper's: fewer stages, fewer keys per CTA, 16-row
  // query steps. Run here, their numerics are checked before any of those GPUs is at hand.
  struct Forced {
    int head_dim;
    TileConfig tiles;
  };
  std::vector<BackwardCase> cases;
  for (const Forced& f :
       {Forced{64, {64, 64, 2}}, Forced{96, {64, 64, 1}}, Forced{128, {32, 64, 2}},
        Forced{192, {32, 64, 1}}, Forced{192, {32, 32, 1}}, Forced{256, {32, 64, 1}},
        Forced{256, {16, 32, 1}}})
    for (bool causal : {false, true}) {
      BackwardCase c{1, 2, 1, 100, 130, f.head_dim, causal};
      c.tiles = f.tiles;
      cases.push_back(c);
    }
  check_cases(cases, 450, "bwd_mma");  // the tile classes of bwd_mma's table
}

TEST_CASE("backward: no queries (seqlen_q 0) give zero dk and dv") {
  for (const std::string& family : families_here())
    for (const BackwardCase& c :
         {BackwardCase{1, 2, 1, 0, 100, 64, false}, BackwardCase{2, 4, 2, 0, 65, 128, true}}) {
      CAPTURE(family);
      CAPTURE(c.describe());
      BackwardProblem problem(engine(), c, 500);
      problem.backward(problem.options(family));
      synchronize(engine());
      const BackwardProblem::Gradients g = problem.gradients();
      check_within_bounds(problem.compare(g), c.dtype);
      auto zero = [&](std::uint16_t bits) { return to_float(c.dtype, bits) == 0.f; };
      CHECK(std::all_of(g.dk.bits.begin(), g.dk.bits.end(), zero));
      CHECK(std::all_of(g.dv.bits.begin(), g.dv.bits.end(), zero));
    }
}

TEST_CASE("backward: deterministic mode repeats bitwise; the default mode repeats dk and dv") {
  // The default's dQ sums key tiles with fp32 atomics in no fixed order, so only its dK and dV
  // (one CTA per key tile) must repeat; deterministic mode repeats all three.
  const std::vector<BackwardCase> cases = {{2, 8, 2, 300, 300, 128, false},
                                           {1, 4, 1, 200, 333, 64, true, DType::fp16},
                                           {1, 2, 2, 150, 70, 256, true}};
  unsigned seed = 600;
  for (const std::string& family : families_here())
    for (BackwardCase c : cases)
      for (bool deterministic : {true, false}) {
        c.deterministic = deterministic;
        CAPTURE(family);
        CAPTURE(c.describe());
        if (!family_has_head_dim(family, c.head_dim)) continue;
        if (deterministic && family == "bwd_wgmma_fused") continue;  // refused (CPU tests)
        BackwardProblem problem(engine(), c, seed++);
        const BackwardOptions options = problem.options(family);
        problem.backward(options);
        synchronize(engine());
        const BackwardProblem::Gradients first = problem.gradients();
        problem.poison();
        problem.backward(options);
        synchronize(engine());
        const BackwardProblem::Gradients second = problem.gradients();
        check_same_bits(first, second, deterministic);
        check_within_bounds(problem.compare(first), c.dtype);
        if (!deterministic) check_within_bounds(problem.compare(second), c.dtype);
        MESSAGE(
            fmt::format("{} {:<42} {}", family, c.describe(), describe(problem.compare(first))));
      }
}

TEST_CASE("backward: the dispatcher picks a dK/dV family on its own") {
  const BackwardCase c{2, 4, 2, 128, 160, 128, true};
  BackwardProblem problem(engine(), c, 700);
  const BackwardOptions options = problem.options();
  const Variant variant =
      engine().select_backward_variant(problem.q(), problem.k(), problem.v(), options);
  const std::vector<std::string> here = families_here();
  CHECK(std::find(here.begin(), here.end(), variant.family) != here.end());
  problem.backward(options);
  synchronize(engine());
  check_within_bounds(problem.compare(problem.gradients()), c.dtype);
}

TEST_CASE("CUDA graphs: a warm backward with its own workspace replays the direct call's result") {
  Stream stream(engine());
  unsigned seed = 800;
  for (const std::string& family : families_here())
    for (bool deterministic : {true, false}) {
      BackwardCase c{2, 4, 2, 200, 256, 128, true};
      c.deterministic = deterministic;
      CAPTURE(family);
      CAPTURE(c.describe());
      if (deterministic && family == "bwd_wgmma_fused") continue;  // refused (CPU tests)
      BackwardProblem problem(engine(), c, seed++);
      BackwardOptions options = problem.options(family);
      const std::size_t need =
          engine().backward_workspace_bytes(problem.q(), problem.k(), problem.v(), options);
      REQUIRE(need > 0);
      DeviceBuffer workspace(engine(), need);
      options.workspace = workspace.data();
      options.workspace_bytes = need;
      auto backward = [&] { problem.backward(options, stream.get()); };

      backward();  // warm: compiles, loads and plans the kernels
      stream.synchronize();
      const BackwardProblem::Gradients direct = problem.gradients();
      check_within_bounds(problem.compare(direct), c.dtype);

      problem.poison();
      const CudaGraph graph(engine().context(), stream.get(), backward);
      stream.synchronize();
      {
        INFO("capturing records the launches without running them");
        check_all_poison(problem.gradients());
      }
      // Twice: a replay must reset what it accumulates (the fp32 dQ) rather than add to the last.
      for (int replay = 1; replay <= 2; ++replay) {
        CAPTURE(replay);
        problem.poison();
        graph.launch(stream.get());
        stream.synchronize();
        const BackwardProblem::Gradients replayed = problem.gradients();
        check_same_bits(direct, replayed, deterministic);
        check_within_bounds(problem.compare(replayed), c.dtype);
      }
    }
}

TEST_CASE("backward: an explicit workspace smaller than backward_workspace_bytes is refused") {
  for (const std::string& family : families_here())
    for (bool deterministic : {false, true}) {
      BackwardCase c{1, 4, 2, 100, 130, 64, false};
      c.deterministic = deterministic;
      CAPTURE(family);
      CAPTURE(c.describe());
      if (deterministic && family == "bwd_wgmma_fused") continue;  // refused (CPU tests)
      BackwardProblem problem(engine(), c, 900);
      BackwardOptions options = problem.options(family);
      const std::size_t need =
          engine().backward_workspace_bytes(problem.q(), problem.k(), problem.v(), options);
      REQUIRE(need > 0);
      DeviceBuffer workspace(engine(), need);
      options.workspace = workspace.data();
      options.workspace_bytes = need - 1;
      check_invalid_argument(
          "one byte short", [&] { problem.backward(options); }, "workspace_bytes");
      synchronize(engine());
      check_all_poison(problem.gradients());
    }
}

TEST_CASE("backward: invalid input throws Error(invalid_argument) before any launch") {
  // sq != sk and GQA, so q's and k's shapes differ in every dimension but batch and head_dim.
  // Each bad view only shrinks a shape, so a launch despite it would stay inside the buffers.
  const BackwardCase c{1, 4, 2, 100, 130, 64, false};
  BackwardProblem problem(engine(), c, 1000);
  // One argument spoiled per call: `spoil` changes a copy of the problem's arguments.
  auto backward_with = [&](auto spoil) {
    return [&problem, spoil] {
      BackwardArgs args(problem);
      spoil(args);
      args.run();
    };
  };
  using A = BackwardArgs;
  check_invalid_argument("dq shorter than q", backward_with([](A& a) { a.dq.shape[1] = 99; }));
  check_invalid_argument("dq with k's heads", backward_with([](A& a) { a.dq.shape[2] = 2; }));
  check_invalid_argument("dk with fewer keys", backward_with([](A& a) { a.dk.shape[1] = 129; }));
  check_invalid_argument("dk with fewer heads", backward_with([](A& a) { a.dk.shape[2] = 1; }));
  check_invalid_argument("dv with fewer keys", backward_with([](A& a) { a.dv.shape[1] = 100; }));
  check_invalid_argument("out shorter than q", backward_with([](A& a) { a.out.shape[1] = 99; }));
  check_invalid_argument("dout shorter than q", backward_with([](A& a) { a.dout.shape[1] = 99; }));
  check_invalid_argument("dout in fp16", backward_with([](A& a) { a.dout.dtype = DType::fp16; }));
  check_invalid_argument("dq in fp16", backward_with([](A& a) { a.dq.dtype = DType::fp16; }));
  check_invalid_argument("dv in fp16", backward_with([](A& a) { a.dv.dtype = DType::fp16; }));
  check_invalid_argument("no LSE", backward_with([](A& a) { a.lse = nullptr; }));
  check_invalid_argument("unknown family",
                         backward_with([](A& a) { a.options.family = "no_such_family"; }));
  check_invalid_argument("a forward family", backward_with([](A& a) { a.options.family = "mma"; }));
  check_invalid_argument("negative scale",
                         backward_with([](A& a) { a.options.softmax_scale = -1.f; }));
  synchronize(engine());
  check_all_poison(problem.gradients());
}

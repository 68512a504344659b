// Engine behaviour on a GPU beyond numerics: bad input launches nothing, concurrency, determinism.
#include <doctest/doctest.h>

#include <chrono>
#include <cmath>
#include <memory>
#include <random>
#include <thread>
#include <vector>

#include "compare.hpp"
#include "device_problem.hpp"
#include "flashjit/device_memory.hpp"
#include "forward_case.hpp"
#include "gpu.hpp"
#include "reference.hpp"
#include "temp_dir.hpp"

using namespace flashjit;
using namespace flashjit::test;

namespace {

// Random q/k/v and a poisoned output of one BSHD problem on the GPU.
struct Problem {
  Problem(Engine& engine, int b, int s, int h, int d, DType dtype = DType::bf16)
      : q(HostTensor::make(dtype, b, s, h, d, false)),
        q_dev(engine, q.bits.size() * 2),
        k_dev(engine, q.bits.size() * 2),
        v_dev(engine, q.bits.size() * 2),
        out_dev(engine, q.bits.size() * 2) {
    std::mt19937 rng(99);
    for (DeviceBuffer* buffer : {&q_dev, &k_dev, &v_dev}) {
      q.fill_random(rng);
      buffer->upload(q.bits.data(), q.bits.size() * 2);
    }
    out_dev.fill_bytes(0xff);
  }
  TensorView view(const DeviceBuffer& buffer) const {
    TensorView v = q.view;
    v.data = buffer.data();
    return v;
  }
  std::vector<std::uint16_t> output() const {
    std::vector<std::uint16_t> bits(q.bits.size());
    out_dev.download(bits.data(), bits.size() * 2);
    return bits;
  }
  HostTensor q;
  DeviceBuffer q_dev, k_dev, v_dev, out_dev;
};

bool untouched(const std::vector<std::uint16_t>& bits) {
  for (auto b : bits)
    if (b != 0xffff) return false;
  return true;
}

}  // namespace

TEST_CASE("bad input throws before any launch: the output stays untouched") {
  Engine& engine = shared_engine();
  Problem p(engine, 1, 64, 2, 64);
  TensorView k = p.view(p.k_dev);
  k.stride[1] += 4;  // not 16-byte aligned
  CHECK_THROWS_AS(engine.forward(p.view(p.q_dev), k, p.view(p.v_dev), p.view(p.out_dev)), Error);
  TensorView v = p.view(p.v_dev);
  v.dtype = DType::fp16;
  CHECK_THROWS_AS(engine.forward(p.view(p.q_dev), p.view(p.k_dev), v, p.view(p.out_dev)), Error);
  ForwardOptions forced;
  forced.family = "wgmma";
  forced.softmax_scale = -1.f;
  CHECK_THROWS_AS(engine.forward(p.view(p.q_dev), p.view(p.k_dev), p.view(p.v_dev),
                                 p.view(p.out_dev), forced),
                  Error);
  synchronize(engine);
  CHECK(untouched(p.output()));
}

TEST_CASE("an empty problem is a no-op") {
  Engine& engine = shared_engine();
  Problem p(engine, 1, 64, 2, 64);
  TensorView q = p.view(p.q_dev), out = p.view(p.out_dev);
  q.shape[1] = out.shape[1] = 0;
  engine.forward(q, p.view(p.k_dev), p.view(p.v_dev), out);
  synchronize(engine);
  CHECK(untouched(p.output()));
}

TEST_CASE("the same input twice gives bitwise the same output") {
  Engine& engine = shared_engine();
  Problem p(engine, 2, 333, 4, 128);
  ForwardOptions options;
  options.causal = true;
  engine.forward(p.view(p.q_dev), p.view(p.k_dev), p.view(p.v_dev), p.view(p.out_dev), options);
  synchronize(engine);
  const auto first = p.output();
  p.out_dev.fill_bytes(0xff);
  engine.forward(p.view(p.q_dev), p.view(p.k_dev), p.view(p.v_dev), p.view(p.out_dev), options);
  synchronize(engine);
  CHECK(first == p.output());
}

TEST_CASE("many threads launching a new variant at once compile and load it once") {
  TempDir dir;
  Engine engine(0, std::make_shared<KernelCache>(CacheOptions{dir.path()}));
  Problem p(engine, 1, 100, 2, 96, DType::fp16);
  std::vector<std::thread> threads;
  std::vector<std::string> errors(8);
  for (auto& error : errors)
    threads.emplace_back([&] {
      try {
        engine.forward(p.view(p.q_dev), p.view(p.k_dev), p.view(p.v_dev), p.view(p.out_dev));
      } catch (const std::exception& e) {
        error = e.what();
      }
    });
  for (auto& t : threads) t.join();
  synchronize(engine);
  for (const auto& error : errors) CHECK(error.empty());
  CHECK(engine.cache().list().size() == 1);
  CHECK_FALSE(untouched(p.output()));
}

TEST_CASE("a warm launch plan serves other buffers of the same shape (maps re-addressed)") {
  Engine& engine = shared_engine();
  // d64 non-causal: on Hopper the 192-row wgmma tiles, whose O also leaves through a tensor map.
  constexpr int kBatch = 1, kHeadsQ = 4, kHeadsKv = 2, kSeqlen = 300, kHeadDim = 64;
  std::mt19937 rng(4321);
  std::vector<std::unique_ptr<DeviceProblem>> problems;  // alive together: distinct addresses
  for (int i = 0; i < 3; ++i) {
    auto q = HostTensor::make(DType::bf16, kBatch, kSeqlen, kHeadsQ, kHeadDim, false);
    auto k = HostTensor::make(DType::bf16, kBatch, kSeqlen, kHeadsKv, kHeadDim, false);
    auto v = HostTensor::make(DType::bf16, kBatch, kSeqlen, kHeadsKv, kHeadDim, false);
    for (HostTensor* t : {&q, &k, &v}) t->fill_random(rng);
    problems.push_back(
        std::make_unique<DeviceProblem>(engine, std::move(q), std::move(k), std::move(v)));
  }
  for (const std::string& family : family_names()) {
    CAPTURE(family);
    ForwardOptions options;
    options.family = family;
    auto run = [&](DeviceProblem& p) {
      options.lse = p.lse();
      engine.forward(p.q(), p.k(), p.v(), p.out(), options);
    };
    try {
      // The first call plans the launch; the others reuse it on other buffers, then the first
      // buffers once more after the outputs are poisoned again.
      for (auto& p : problems) run(*p);
      synchronize(engine);
      problems[0]->poison();
      run(*problems[0]);
      synchronize(engine);
    } catch (const Error& e) {
      if (e.code() != ErrorCode::unsupported) throw;
      MESSAGE(family, " not run: ", e.what());
      continue;
    }
    for (const auto& p : problems) {
      const Reference ref = reference_attention(p->host_q(), p->host_k(), p->host_v(),
                                                1.0 / std::sqrt(double(kHeadDim)), false);
      const std::vector<float> lse = p->lse_values();
      check_within_bounds(compare_forward(p->output(), &lse, ref), DType::bf16);
    }
  }
}

TEST_CASE("an engine records each variant it runs once, in a manifest precompile reads") {
  Engine& engine = shared_engine();
  TempDir dir;
  const auto manifest = dir.path() / "used.txt";
  engine.record_variants(manifest);
  Problem a(engine, 1, 200, 4, 64), b(engine, 1, 300, 4, 128);
  ForwardOptions options;
  for (int repeat = 0; repeat < 3; ++repeat)
    for (Problem* p : {&a, &b})
      engine.forward(p->view(p->q_dev), p->view(p->k_dev), p->view(p->v_dev), p->view(p->out_dev),
                     options);
  synchronize(engine);
  const auto recorded = read_variant_manifest(manifest);
  REQUIRE(recorded.size() == 2);
  auto chosen = [&](Problem& p) {
    return engine.select_variant(p.view(p.q_dev), p.view(p.k_dev), p.view(p.v_dev),
                                 p.view(p.out_dev));
  };
  CHECK(recorded[0] == chosen(a));
  CHECK(recorded[1] == chosen(b));
  engine.record_variants({});  // stop: later tests must not append to a removed file
}

TEST_CASE("never-block: a kernel not compiled yet runs a compiled stand-in, then switches") {
  if (shared_engine().device().arch != "sm_90a") {
    MESSAGE("not an sm_90a GPU: never-block test (wgmma wanted, mma stand-in) not run");
    return;
  }
  TempDir dir;
  auto cache = std::make_shared<KernelCache>(CacheOptions{dir.path()});
  Engine engine(0, cache);
  engine.set_never_block(true);
  std::mt19937 rng(77);
  std::vector<std::unique_ptr<DeviceProblem>> problems;  // one per thread below
  for (int i = 0; i < 3; ++i) {
    auto q = HostTensor::make(DType::bf16, 1, 300, 4, 128, false);
    auto k = HostTensor::make(DType::bf16, 1, 300, 2, 128, false);
    auto v = HostTensor::make(DType::bf16, 1, 300, 2, 128, false);
    for (HostTensor* t : {&q, &k, &v}) t->fill_random(rng);
    problems.push_back(
        std::make_unique<DeviceProblem>(engine, std::move(q), std::move(k), std::move(v)));
  }
  DeviceProblem& p = *problems[0];
  const ForwardOptions options;
  const Variant wanted = engine.select_variant(p.q(), p.k(), p.v(), p.out(), options);
  ForwardOptions mma;
  mma.family = "mma";
  const Variant stand_in = engine.select_variant(p.q(), p.k(), p.v(), p.out(), mma);
  REQUIRE(wanted.family == "wgmma");
  REQUIRE(cache->compile(stand_in).ok);  // the only kernel compiled for this problem

  auto check = [&](DeviceProblem& problem) {
    const Reference ref = reference_attention(problem.host_q(), problem.host_k(), problem.host_v(),
                                              1.0 / std::sqrt(128.0), false);
    check_within_bounds(compare_forward(problem.output(), nullptr, ref), DType::bf16);
  };
  const auto start = std::chrono::steady_clock::now();
  engine.forward(p.q(), p.k(), p.v(), p.out(), options);
  const double first_ms =
      std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - start).count();
  CHECK(engine.running_variant(p.q(), p.k(), p.v(), p.out(), options) == stand_in);
  MESSAGE("first call ", first_ms, " ms (the wanted variant compiles for ~1 s)");
  CHECK(first_ms < 500);
  synchronize(engine);
  check(p);

  // Threads keep calling while the compile finishes: each call runs the stand-in or the wanted
  // kernel, never anything half-switched.
  std::vector<std::thread> threads;
  for (auto& problem : problems)
    threads.emplace_back([&, problem = problem.get()] {
      const Stream stream(engine);
      for (int i = 0; i < 200; ++i)
        engine.forward(problem->q(), problem->k(), problem->v(), problem->out(), options,
                       stream.get());
      stream.synchronize();
    });
  for (auto& thread : threads) thread.join();
  engine.wait_for_background_compiles();
  for (auto& problem : problems) check(*problem);

  p.poison();
  engine.forward(p.q(), p.k(), p.v(), p.out(), options);
  synchronize(engine);
  CHECK(engine.running_variant(p.q(), p.k(), p.v(), p.out(), options) == wanted);
  check(p);

  // Without never-block the same first call compiles and runs the wanted kernel.
  TempDir other;
  Engine waiting(0, std::make_shared<KernelCache>(CacheOptions{other.path()}));
  waiting.forward(p.q(), p.k(), p.v(), p.out(), options);
  synchronize(waiting);
  CHECK(waiting.running_variant(p.q(), p.k(), p.v(), p.out(), options) == wanted);
}

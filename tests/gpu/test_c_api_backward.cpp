// The C API's backward on a GPU: flashjit_backward computes the bits Engine::backward computes
// (deterministic mode, so two runs can agree bit for bit), and its options reach the engine.
#include <doctest/doctest.h>

#include <cstdint>
#include <random>
#include <string>
#include <vector>

#include "flashjit/device_memory.hpp"
#include "flashjit/flashjit.h"
#include "gpu.hpp"
#include "reference.hpp"

using namespace flashjit;
using namespace flashjit::test;

namespace {

// One device tensor with its host twin's shape: random bf16 contents (or none for outputs).
struct DeviceTensor {
  HostTensor host;
  DeviceBuffer device;

  DeviceTensor(const Engine& engine, std::int64_t s, std::int64_t h, std::mt19937* rng)
      : host(HostTensor::make(DType::bf16, 1, s, h, 64, false)), device(engine, host.bytes()) {
    if (rng != nullptr) {
      host.fill_random(*rng);
      device.upload(host.bits.data(), host.bytes());
    }
  }
  TensorView view() const {
    TensorView v = host.view;
    v.data = device.data();
    return v;
  }
  flashjit_tensor c() const {
    flashjit_tensor t{device.data(), FLASHJIT_BF16, {}, {}};
    for (int i = 0; i < 4; ++i) t.shape[i] = host.view.shape[i], t.stride[i] = host.view.stride[i];
    return t;
  }
  std::vector<std::uint16_t> download() const {
    std::vector<std::uint16_t> bits(host.bits.size());
    device.download(bits.data(), host.bytes());
    return bits;
  }
};

}  // namespace

TEST_CASE("flashjit_backward computes what Engine::backward computes; its options reach it") {
  Engine& engine = shared_engine();
  std::mt19937 rng(41);
  // GQA (4 query heads on 2 KV heads), seqlen_q != seqlen_k, causal (bottom-right).
  constexpr int kQ = 150, kK = 190;
  const DeviceTensor q(engine, kQ, 4, &rng), k(engine, kK, 2, &rng), v(engine, kK, 2, &rng);
  const DeviceTensor dout(engine, kQ, 4, &rng), out(engine, kQ, 4, nullptr);
  DeviceBuffer lse(engine, sizeof(float) * kQ * 4);
  ForwardOptions forward;
  forward.causal = true;
  forward.lse = static_cast<float*>(lse.data());
  engine.forward(q.view(), k.view(), v.view(), out.view(), forward);

  const DeviceTensor c_dq(engine, kQ, 4, nullptr), c_dk(engine, kK, 2, nullptr),
      c_dv(engine, kK, 2, nullptr);
  const DeviceTensor cpp_dq(engine, kQ, 4, nullptr), cpp_dk(engine, kK, 2, nullptr),
      cpp_dv(engine, kK, 2, nullptr);
  flashjit_engine* handle = nullptr;
  REQUIRE(flashjit_engine_create(0, nullptr, &handle) == FLASHJIT_OK);
  flashjit_backward_options options{};
  options.causal = 1;
  options.deterministic = 1;
  const flashjit_tensor tq = q.c(), tk = k.c(), tv = v.c(), tout = out.c(), tdout = dout.c();
  const flashjit_tensor tdq = c_dq.c(), tdk = c_dk.c(), tdv = c_dv.c();
  const float* lse_ptr = static_cast<const float*>(lse.data());
  REQUIRE(flashjit_backward(handle, &tq, &tk, &tv, &tout, &tdout, lse_ptr, &tdq, &tdk, &tdv,
                            &options, nullptr) == FLASHJIT_OK);
  BackwardOptions cpp_options;
  cpp_options.causal = true;
  cpp_options.deterministic = true;
  engine.backward(q.view(), k.view(), v.view(), out.view(), dout.view(), lse_ptr, cpp_dq.view(),
                  cpp_dk.view(), cpp_dv.view(), cpp_options);
  synchronize(engine);
  CHECK(c_dq.download() == cpp_dq.download());
  CHECK(c_dk.download() == cpp_dk.download());
  CHECK(c_dv.download() == cpp_dv.download());

  // The workspace size and the variant are the C++ engine's; causal and family reach them.
  std::uint64_t bytes = 0;
  REQUIRE(flashjit_backward_workspace_bytes(handle, &tq, &tk, &tv, &options, &bytes) ==
          FLASHJIT_OK);
  CHECK(bytes == engine.backward_workspace_bytes(q.view(), k.view(), v.view(), cpp_options));
  char name[128];
  REQUIRE(flashjit_select_backward_variant(handle, &tq, &tk, &tv, &options, name, sizeof name) ==
          FLASHJIT_OK);
  const Variant chosen = Variant::parse(name);
  CHECK(chosen == engine.select_backward_variant(q.view(), k.view(), v.view(), cpp_options));
  CHECK(chosen.causal);
  options.family = chosen.family.c_str();
  CHECK(flashjit_select_backward_variant(handle, &tq, &tk, &tv, &options, name, sizeof name) ==
        FLASHJIT_OK);
  options.family = "mma";  // a forward family: refused, named
  CHECK(flashjit_select_backward_variant(handle, &tq, &tk, &tv, &options, name, sizeof name) !=
        FLASHJIT_OK);
  CHECK(std::string(flashjit_last_error()).find("mma") != std::string::npos);
  options.family = nullptr;

  // Bad input is named and launches nothing.
  flashjit_tensor bad = tdk;
  bad.shape[2] = 1;  // dk must have k's shape
  CHECK(flashjit_backward(handle, &tq, &tk, &tv, &tout, &tdout, lse_ptr, &tdq, &bad, &tdv, &options,
                          nullptr) == FLASHJIT_INVALID_ARGUMENT);
  CHECK(std::string(flashjit_last_error()).find("dk") != std::string::npos);
  CHECK(flashjit_backward(handle, &tq, &tk, &tv, &tout, &tdout, nullptr, &tdq, &tdk, &tdv, &options,
                          nullptr) == FLASHJIT_INVALID_ARGUMENT);
  CHECK(std::string(flashjit_last_error()).find("lse") != std::string::npos);
  flashjit_engine_destroy(handle);
}

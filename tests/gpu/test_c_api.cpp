// The C API on a GPU: a forward through flashjit_forward matches the C++ engine's output.
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

// Random bf16 q, k, v of one shape [1, tokens, 4, 64] (BHSD) on the device, an output for the C
// API's forward and one for Engine::forward's, and the C views of them.
struct CAndCpp {
  Engine& engine;
  HostTensor q;
  std::size_t bytes;
  DeviceBuffer dq, dk, dv, c_out, cpp_out;
  flashjit_tensor tq, tk, tv, tout;

  CAndCpp(Engine& e, int tokens, unsigned seed)
      : engine(e),
        q(HostTensor::make(DType::bf16, 1, tokens, 4, 64, true)),
        bytes(q.bytes()),
        dq(e, bytes), dk(e, bytes), dv(e, bytes), c_out(e, bytes), cpp_out(e, bytes) {
    std::mt19937 rng(seed);
    for (DeviceBuffer* buffer : {&dq, &dk, &dv}) {
      q.fill_random(rng);
      buffer->upload(q.bits.data(), bytes);
    }
    tq = c_tensor(dq), tk = c_tensor(dk), tv = c_tensor(dv), tout = c_tensor(c_out);
  }
  flashjit_tensor c_tensor(const DeviceBuffer& buffer) const {
    flashjit_tensor t{buffer.data(), FLASHJIT_BF16, {}, {}};
    for (int i = 0; i < 4; ++i) {
      t.shape[i] = q.view.shape[i];
      t.stride[i] = q.view.stride[i];
    }
    return t;
  }
  TensorView with(const DeviceBuffer& buffer) const {
    TensorView view = q.view;
    view.data = buffer.data();
    return view;
  }
  // flashjit_forward with `options` and Engine::forward with `cpp_options` give the same bits.
  bool same_bits(flashjit_engine* handle, const flashjit_forward_options& options,
                 const ForwardOptions& cpp_options) {
    c_out.fill_bytes(0xff);
    cpp_out.fill_bytes(0xff);
    REQUIRE(flashjit_forward(handle, &tq, &tk, &tv, &tout, &options, nullptr) == FLASHJIT_OK);
    engine.forward(with(dq), with(dk), with(dv), with(cpp_out), cpp_options);
    synchronize(engine);
    std::vector<std::uint16_t> from_c(q.bits.size()), from_cpp(q.bits.size());
    c_out.download(from_c.data(), bytes);
    cpp_out.download(from_cpp.data(), bytes);
    return from_c == from_cpp;
  }
};

}  // namespace

TEST_CASE("flashjit_forward computes what Engine::forward computes, and rejects bad input") {
  Engine& engine = shared_engine();
  CAndCpp p(engine, 150, 5);
  const flashjit_tensor &tq = p.tq, &tk = p.tk, &tv = p.tv, &tout = p.tout;
  flashjit_engine* handle = nullptr;
  REQUIRE(flashjit_engine_create(0, nullptr, &handle) == FLASHJIT_OK);
  flashjit_forward_options options{0.f, 1, nullptr, nullptr};
  ForwardOptions cpp_options;
  cpp_options.causal = true;
  CHECK(p.same_bits(handle, options, cpp_options));

  flashjit_tensor bad = tk;
  bad.stride[3] = 2;
  CHECK(flashjit_forward(handle, &tq, &bad, &tv, &tout, &options, nullptr) ==
        FLASHJIT_INVALID_ARGUMENT);
  CHECK(std::string(flashjit_last_error()).find("k.stride[3]") != std::string::npos);
  char name[128];
  CHECK(flashjit_select_variant(handle, &tq, &tk, &tv, &tout, &options, name, sizeof name) ==
        FLASHJIT_OK);
  CHECK(Variant::parse(name).causal);
  // The C options' softcap reaches the same kernel as ForwardOptions::softcap.
  options.softcap = 20.f;
  cpp_options.softcap = 20.f;
  CHECK(p.same_bits(handle, options, cpp_options));
  CHECK(flashjit_select_variant(handle, &tq, &tk, &tv, &tout, &options, name, sizeof name) ==
        FLASHJIT_OK);
  CHECK(Variant::parse(name).softcap);
  options.softcap = -1.f;
  CHECK(flashjit_forward(handle, &tq, &tk, &tv, &tout, &options, nullptr) ==
        FLASHJIT_INVALID_ARGUMENT);
  CHECK(std::string(flashjit_last_error()).find("softcap is -1") != std::string::npos);
  options.softcap = cpp_options.softcap = 0.f;
  // So do the window (sliding_window on) and the sinks.
  const std::vector<float> sinks(static_cast<std::size_t>(p.q.view.shape[2]), 1.5f);
  DeviceBuffer sink_buffer(engine, sinks.size() * sizeof(float) + 4);
  sink_buffer.upload(sinks.data(), sinks.size() * sizeof(float));
  options.sliding_window = 1, options.window_left = 37, options.window_right = 0;
  options.sink_logits = static_cast<const float*>(sink_buffer.data());
  cpp_options.window_left = 37, cpp_options.window_right = 0;
  cpp_options.sink_logits = options.sink_logits;
  CHECK(p.same_bits(handle, options, cpp_options));
  CHECK(flashjit_select_variant(handle, &tq, &tk, &tv, &tout, &options, name, sizeof name) ==
        FLASHJIT_OK);
  const Variant both = Variant::parse(name);
  CHECK(both.window);
  CHECK(both.sink);
  options.sink_logits = reinterpret_cast<const float*>(
      static_cast<const char*>(sink_buffer.data()) + 2);  // misaligned
  CHECK(flashjit_forward(handle, &tq, &tk, &tv, &tout, &options, nullptr) ==
        FLASHJIT_INVALID_ARGUMENT);
  CHECK(std::string(flashjit_last_error()).find("sink_logits") != std::string::npos);
  options.sink_logits = cpp_options.sink_logits;
  // And ALiBi's slopes (the sinks' buffer again: 1.5 per head) and the window's sink tokens.
  options.alibi_slopes = cpp_options.alibi_slopes = options.sink_logits;
  options.sink_tokens = cpp_options.sink_tokens = 4;
  CHECK(p.same_bits(handle, options, cpp_options));
  CHECK(flashjit_select_variant(handle, &tq, &tk, &tv, &tout, &options, name, sizeof name) ==
        FLASHJIT_OK);
  const Variant all = Variant::parse(name);
  CHECK(all.window);
  CHECK(all.sink);
  CHECK(all.alibi);
  options.alibi_slopes = reinterpret_cast<const float*>(
      static_cast<const char*>(sink_buffer.data()) + 2);  // misaligned
  CHECK(flashjit_forward(handle, &tq, &tk, &tv, &tout, &options, nullptr) ==
        FLASHJIT_INVALID_ARGUMENT);
  CHECK(std::string(flashjit_last_error()).find("alibi_slopes") != std::string::npos);
  options.alibi_slopes = cpp_options.alibi_slopes;
  options.sliding_window = 0;  // the window off: its sink tokens have nothing to ride in
  CHECK(flashjit_forward(handle, &tq, &tk, &tv, &tout, &options, nullptr) ==
        FLASHJIT_INVALID_ARGUMENT);
  CHECK(std::string(flashjit_last_error()).find("sink_tokens is 4") != std::string::npos);
  flashjit_engine_destroy(handle);
}

TEST_CASE("the C API's user functions and block masks reach the engine: the same bits as C++") {
  Engine& engine = shared_engine();
  constexpr int kTokens = 300;
  CAndCpp p(engine, kTokens, 14);
  const flashjit_tensor &tq = p.tq, &tk = p.tk, &tv = p.tv, &tout = p.tout;
  // Documents of 70 tokens (the last one shorter): tiles wholly inside, across and outside one.
  std::vector<std::int32_t> doc(kTokens);
  for (int i = 0; i < kTokens; ++i) doc[static_cast<size_t>(i)] = i / 70;
  DeviceBuffer doc_ids(engine, doc.size() * sizeof(std::int32_t));
  doc_ids.upload(doc.data(), doc.size() * sizeof(std::int32_t));
  const char* source =
      "__device__ bool mask_mod(int b, int h, int q, int k, const flashjit::UserArgs& a) {\n"
      "  const int* doc = static_cast<const int*>(a.ptr[0]);\n  return doc[q] == doc[k];\n}\n";
  const UserFunctions cpp_functions("", source);
  flashjit_user_functions* functions = nullptr;
  REQUIRE(flashjit_user_functions_create(nullptr, source, nullptr, &functions) == FLASHJIT_OK);

  flashjit_engine* handle = nullptr;
  REQUIRE(flashjit_engine_create(0, nullptr, &handle) == FLASHJIT_OK);
  flashjit_forward_options options{};
  options.causal = 1;
  options.user_functions = functions;
  options.user_args[0] = doc_ids.data();
  ForwardOptions cpp_options;
  cpp_options.causal = true;
  cpp_options.user_functions = &cpp_functions;
  cpp_options.user_args[0] = doc_ids.data();
  CHECK(p.same_bits(handle, options, cpp_options));
  char name[160];
  REQUIRE(flashjit_select_variant(handle, &tq, &tk, &tv, &tout, &options, name, sizeof name) ==
          FLASHJIT_OK);
  CHECK(Variant::parse(name).user_functions == flashjit_user_functions_hash(functions));

  if (engine.device().arch != "sm_90a") {
    MESSAGE("block masks need the wgmma family (sm_90a); this GPU compiles for ",
            engine.device().arch);
  } else {
    flashjit_block_mask* mask = nullptr;
    REQUIRE(flashjit_block_mask_create(handle, &tq, &tk, &tv, &tout, &options, 1, 1, nullptr,
                                       &mask) == FLASHJIT_OK);
    const BlockMask cpp_mask = engine.create_block_mask(
        p.with(p.dq), p.with(p.dk), p.with(p.dv), p.with(p.cpp_out), cpp_options, {true, true});
    std::int64_t partial = -1, full = -1, total = -1;
    REQUIRE(flashjit_block_mask_counts(mask, &partial, &full, &total) == FLASHJIT_OK);
    const BlockMask::Counts counts = cpp_mask.counts();
    CHECK(partial == counts.partial);
    CHECK(full == counts.full);
    CHECK(total == counts.total);
    CHECK(partial > 0);
    CHECK(partial + full < total);  // some causal tiles lie wholly in other documents
    char mask_variant[160];
    REQUIRE(flashjit_block_mask_variant(mask, mask_variant, sizeof mask_variant) == FLASHJIT_OK);
    CHECK(std::string(mask_variant) == cpp_mask.variant().name());
    options.block_mask = mask;
    cpp_options.block_mask = &cpp_mask;
    CHECK(p.same_bits(handle, options, cpp_options));
    // A block mask without the user functions it was built from is refused.
    options.user_functions = nullptr;
    options.user_args[0] = nullptr;
    CHECK(flashjit_forward(handle, &tq, &tk, &tv, &tout, &options, nullptr) ==
          FLASHJIT_INVALID_ARGUMENT);
    CHECK(std::string(flashjit_last_error()).find("block_mask") != std::string::npos);
    flashjit_block_mask_destroy(mask);
  }
  // user_args without user functions name the slot.
  options.user_functions = nullptr;
  options.block_mask = nullptr;
  options.user_args[3] = doc_ids.data();
  CHECK(flashjit_forward(handle, &tq, &tk, &tv, &tout, &options, nullptr) ==
        FLASHJIT_INVALID_ARGUMENT);
  CHECK(std::string(flashjit_last_error()).find("user_args[3]") != std::string::npos);
  flashjit_user_functions_destroy(functions);
  flashjit_engine_destroy(handle);
}

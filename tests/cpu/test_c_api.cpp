// The C API without a GPU: status codes and messages for the calls that need none or fail.
#include <doctest/doctest.h>

#include <cstddef>
#include <string>

#include "flashjit/flashjit.h"
#include "temp_dir.hpp"

TEST_CASE("version and precompile work with no GPU") {
  CHECK(std::string(flashjit_version()) == FLASHJIT_VERSION_STRING);
  CHECK(std::string(flashjit_nvrtc_version()).find('.') != std::string::npos);
  flashjit::test::TempDir dir;
  const char* names[] = {"simt.sm80.fp16.d64.m64n64s1.causal"};
  CHECK(flashjit_precompile(dir.path().c_str(), names, 1) == FLASHJIT_OK);
  const char* bad[] = {"simt.sm80.fp16.d65.m64n64s1"};
  CHECK(flashjit_precompile(dir.path().c_str(), bad, 1) == FLASHJIT_INVALID_ARGUMENT);
  CHECK(std::string(flashjit_last_error()).find("head_dim") != std::string::npos);
}

TEST_CASE("engine creation reports the missing driver; null handles are invalid arguments") {
  flashjit_engine* engine = nullptr;
  const flashjit_status status = flashjit_engine_create(0, nullptr, &engine);
  if (status == FLASHJIT_OK) {
    MESSAGE("a GPU is present; the no-driver path is not exercised here");
    flashjit_engine_destroy(engine);
  } else {
    CHECK((status == FLASHJIT_NO_DRIVER || status == FLASHJIT_NO_DEVICE));
    CHECK(engine == nullptr);
    CHECK(std::string(flashjit_last_error()).find("CUDA") != std::string::npos);
  }
  CHECK(flashjit_engine_create(0, nullptr, nullptr) == FLASHJIT_INVALID_ARGUMENT);
  CHECK(flashjit_forward(nullptr, nullptr, nullptr, nullptr, nullptr, nullptr, nullptr) ==
        FLASHJIT_INVALID_ARGUMENT);
  CHECK(std::string(flashjit_last_error()).find("engine is null") != std::string::npos);
}

// Fields are only ever appended (an older library reads the prefix it knows), and zero means off.
// That sink_logits, alibi_slopes and sink_tokens reach ForwardOptions takes an engine:
// tests/gpu/test_c_api.cpp.
TEST_CASE("flashjit_forward_options ends with sink_tokens; a zeroed struct has none of them") {
  const flashjit_forward_options options{};
  CHECK(options.sink_logits == nullptr);
  CHECK(options.alibi_slopes == nullptr);
  CHECK(options.sink_tokens == 0);
  CHECK(offsetof(flashjit_forward_options, sink_logits) >
        offsetof(flashjit_forward_options, window_right));
  CHECK(offsetof(flashjit_forward_options, alibi_slopes) ==
        offsetof(flashjit_forward_options, sink_logits) + sizeof(options.sink_logits));
  CHECK(offsetof(flashjit_forward_options, sink_tokens) ==
        offsetof(flashjit_forward_options, alibi_slopes) + sizeof(options.alibi_slopes));
  // Only the tail padding of a pointer-aligned struct follows (4 bytes on 64-bit targets).
  constexpr std::size_t end = offsetof(flashjit_forward_options, sink_tokens) + sizeof(int32_t);
  constexpr std::size_t align = alignof(flashjit_forward_options);
  CHECK(sizeof(flashjit_forward_options) == (end + align - 1) / align * align);
  if (sizeof(void*) == 8) CHECK(sizeof(flashjit_forward_options) == 96);
}

// The C API's backward entry points without a GPU: the options struct's layout, which families
// are backward ones, and the status and message of each null or malformed argument.
#include <doctest/doctest.h>

#include <cstddef>
#include <cstdint>
#include <string>

#include "flashjit/flashjit.h"
#include "flashjit/flashjit.hpp"

namespace {

// A well-formed view of memory nothing reads: the tensors are checked before the engine, so a
// null engine is what these calls trip on unless a tensor is bad first.
flashjit_tensor a_tensor() {
  return {reinterpret_cast<void*>(0x100000), FLASHJIT_BF16, {1, 64, 2, 64}, {8192, 128, 64, 1}};
}

std::string last_error() { return flashjit_last_error(); }

}  // namespace

TEST_CASE("flashjit_backward_options: zero is the default, and no padding lies between fields") {
  const flashjit_backward_options options{};
  CHECK(options.softmax_scale == 0.f);  // 1/sqrt(head_dim)
  CHECK(options.causal == 0);
  CHECK(options.deterministic == 0);
  CHECK(options.family == nullptr);
  CHECK(options.workspace == nullptr);
  // The int32 fields first, then the pointers: every field where the previous one ends, which
  // tools/compare's and the Python package's ctypes mirror checks too.
  using O = flashjit_backward_options;
  CHECK(offsetof(O, causal) == 4);
  CHECK(offsetof(O, deterministic) == 8);
  CHECK(offsetof(O, tile_m) == 12);
  CHECK(offsetof(O, tile_n) == 16);
  CHECK(offsetof(O, stages) == 20);
  CHECK(offsetof(O, family) == 24);
  CHECK(offsetof(O, workspace) == offsetof(O, family) + sizeof(void*));
  CHECK(offsetof(O, workspace_bytes) == offsetof(O, workspace) + sizeof(void*));
  CHECK(offsetof(O, alibi_slopes) == offsetof(O, workspace_bytes) + sizeof(std::uint64_t));
  CHECK(offsetof(O, sink_logits) == offsetof(O, alibi_slopes) + sizeof(void*));
  CHECK(offsetof(O, d_sink_logits) == offsetof(O, sink_logits) + sizeof(void*));
  CHECK(offsetof(O, user_functions) == offsetof(O, d_sink_logits) + sizeof(void*));
  CHECK(offsetof(O, user_args) == offsetof(O, user_functions) + sizeof(void*));
  CHECK(offsetof(O, softcap) == offsetof(O, user_args) + FLASHJIT_MAX_USER_ARGS * sizeof(void*));
  CHECK(offsetof(O, sliding_window) == offsetof(O, softcap) + 4);
  CHECK(offsetof(O, window_left) == offsetof(O, sliding_window) + 4);
  CHECK(offsetof(O, window_right) == offsetof(O, window_left) + 4);
  CHECK(offsetof(O, sink_tokens) == offsetof(O, window_right) + 4);
  // sink_tokens, then padding up to the pointer alignment (4 bytes on 64-bit targets), then the
  // block mask (appended in version 0.1's session 18; the layout before it is unchanged).
  constexpr std::size_t align = alignof(O);
  CHECK(offsetof(O, block_mask) == (offsetof(O, sink_tokens) + 4 + align - 1) / align * align);
  CHECK(sizeof(O) == offsetof(O, block_mask) + sizeof(void*));
  if (sizeof(void*) == 8) CHECK(sizeof(O) == 176);
  CHECK(options.block_mask == nullptr);
  CHECK(options.user_functions == nullptr);
  CHECK(options.softcap == 0.f);  // no variant
  CHECK(options.sliding_window == 0);
  CHECK(options.alibi_slopes == nullptr);
  CHECK(options.d_sink_logits == nullptr);
}

TEST_CASE("flashjit_family_is_backward reads FamilyInfo::backward; no family is both kinds") {
  const auto& families = flashjit::families();
  REQUIRE(flashjit_family_count() == static_cast<int32_t>(families.size()));
  for (int32_t i = 0; i < flashjit_family_count(); ++i) {
    const flashjit::FamilyInfo& family = families[static_cast<std::size_t>(i)];
    CAPTURE(family.name);
    CHECK(flashjit_family_is_backward(i) == (family.backward ? 1 : 0));
    CHECK_FALSE((flashjit_family_is_backward(i) && flashjit_family_is_attention(i)));
  }
  CHECK(flashjit_family_is_backward(-1) == 0);
  CHECK(flashjit_family_is_backward(flashjit_family_count()) == 0);
}

TEST_CASE("flashjit_backward names its first null or malformed tensor, then a null engine") {
  const flashjit_tensor t = a_tensor();
  const float* lse = reinterpret_cast<const float*>(0x200000);
  const flashjit_backward_options options{};

  // Everything well formed but the engine (options NULL is the default, not an error).
  CHECK(flashjit_backward(nullptr, &t, &t, &t, &t, &t, lse, &t, &t, &t, nullptr, nullptr) ==
        FLASHJIT_INVALID_ARGUMENT);
  CHECK(last_error() == "engine is null: expected one from flashjit_engine_create");
  CHECK(flashjit_backward(nullptr, &t, &t, &t, &t, &t, lse, &t, &t, &t, &options, nullptr) ==
        FLASHJIT_INVALID_ARGUMENT);
  CHECK(last_error().find("engine is null") != std::string::npos);

  // Each tensor in turn null: it is the one named (the ones before it are fine).
  const char* names[] = {"q", "k", "v", "out", "dout", "dq", "dk", "dv"};
  for (int missing = 0; missing < 8; ++missing) {
    const flashjit_tensor* p[8];
    for (int i = 0; i < 8; ++i) p[i] = i == missing ? nullptr : &t;
    CAPTURE(names[missing]);
    CHECK(flashjit_backward(nullptr, p[0], p[1], p[2], p[3], p[4], lse, p[5], p[6], p[7], &options,
                            nullptr) == FLASHJIT_INVALID_ARGUMENT);
    CHECK(last_error() == std::string(names[missing]) + " is null: expected a flashjit_tensor");
  }
  CHECK(flashjit_backward(nullptr, nullptr, nullptr, nullptr, nullptr, nullptr, nullptr, nullptr,
                          nullptr, nullptr, nullptr, nullptr) == FLASHJIT_INVALID_ARGUMENT);
  CHECK(last_error() == "q is null: expected a flashjit_tensor");

  flashjit_tensor fp32 = t;
  fp32.dtype = 2;  // no such flashjit_dtype
  CHECK(flashjit_backward(nullptr, &t, &t, &t, &t, &t, lse, &fp32, &t, &t, &options, nullptr) ==
        FLASHJIT_INVALID_ARGUMENT);
  CHECK(last_error() == "dq.dtype is not FLASHJIT_BF16 or FLASHJIT_FP16");
}

TEST_CASE("flashjit_backward_workspace_bytes and _select_backward_variant check the same way") {
  const flashjit_tensor t = a_tensor();
  std::uint64_t bytes = 7;
  CHECK(flashjit_backward_workspace_bytes(nullptr, &t, &t, &t, nullptr, &bytes) ==
        FLASHJIT_INVALID_ARGUMENT);
  CHECK(last_error().find("engine is null") != std::string::npos);
  CHECK(flashjit_backward_workspace_bytes(nullptr, &t, nullptr, &t, nullptr, &bytes) ==
        FLASHJIT_INVALID_ARGUMENT);
  CHECK(last_error() == "k is null: expected a flashjit_tensor");
  CHECK(bytes == 7);  // untouched on failure

  char name[128] = "untouched";
  CHECK(flashjit_select_backward_variant(nullptr, &t, &t, nullptr, nullptr, name, sizeof name) ==
        FLASHJIT_INVALID_ARGUMENT);
  CHECK(last_error() == "v is null: expected a flashjit_tensor");
  CHECK(flashjit_select_backward_variant(nullptr, &t, &t, &t, nullptr, name, sizeof name) ==
        FLASHJIT_INVALID_ARGUMENT);
  CHECK(last_error().find("engine is null") != std::string::npos);
  CHECK(std::string(name) == "untouched");
}

TEST_CASE("flashjit_backward_varlen and its queries check tensors, then the batch, then the engine") {
  const flashjit_tensor t = a_tensor();
  const float* lse = reinterpret_cast<const float*>(0x200000);
  const flashjit_varlen varlen{reinterpret_cast<const int32_t*>(0x300000),
                               reinterpret_cast<const int32_t*>(0x400000), 2, 32, 32};
  CHECK(flashjit_backward_varlen(nullptr, &t, &t, &t, &t, &t, lse, &t, &t, &t, &varlen, nullptr,
                                 nullptr) == FLASHJIT_INVALID_ARGUMENT);
  CHECK(last_error() == "engine is null: expected one from flashjit_engine_create");
  CHECK(flashjit_backward_varlen(nullptr, &t, &t, &t, &t, nullptr, lse, &t, &t, &t, &varlen,
                                 nullptr, nullptr) == FLASHJIT_INVALID_ARGUMENT);
  CHECK(last_error() == "dout is null: expected a flashjit_tensor");
  CHECK(flashjit_backward_varlen(nullptr, &t, &t, &t, &t, &t, lse, &t, &t, &t, nullptr, nullptr,
                                 nullptr) == FLASHJIT_INVALID_ARGUMENT);
  CHECK(last_error() == "varlen is null: expected a flashjit_varlen");

  std::uint64_t bytes = 7;
  CHECK(flashjit_backward_workspace_bytes_varlen(nullptr, &t, &t, &t, nullptr, nullptr, &bytes) ==
        FLASHJIT_INVALID_ARGUMENT);
  CHECK(last_error() == "varlen is null: expected a flashjit_varlen");
  CHECK(flashjit_backward_workspace_bytes_varlen(nullptr, &t, &t, &t, &varlen, nullptr, &bytes) ==
        FLASHJIT_INVALID_ARGUMENT);
  CHECK(last_error().find("engine is null") != std::string::npos);
  CHECK(bytes == 7);
  char name[128] = "untouched";
  CHECK(flashjit_select_backward_variant_varlen(nullptr, nullptr, &t, &t, &varlen, nullptr, name,
                                                sizeof name) == FLASHJIT_INVALID_ARGUMENT);
  CHECK(last_error() == "q is null: expected a flashjit_tensor");
  CHECK(flashjit_select_backward_variant_varlen(nullptr, &t, &t, &t, &varlen, nullptr, name,
                                                sizeof name) == FLASHJIT_INVALID_ARGUMENT);
  CHECK(last_error().find("engine is null") != std::string::npos);
  CHECK(std::string(name) == "untouched");
}

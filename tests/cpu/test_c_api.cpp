// The C API without a GPU: status codes and messages for the calls that need none or fail.
#include <doctest/doctest.h>

#include <cstddef>
#include <cstdint>
#include <fstream>
#include <string>

#include "flashjit/flashjit.h"
#include "flashjit/flashjit.hpp"
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
// That sink_logits, alibi_slopes, sink_tokens and the user functions reach ForwardOptions takes an
// engine: tests/gpu/test_c_api.cpp.
TEST_CASE("flashjit_forward_options ends with block_mask; a zeroed struct has none of them") {
  const flashjit_forward_options options{};
  CHECK(options.sink_logits == nullptr);
  CHECK(options.alibi_slopes == nullptr);
  CHECK(options.sink_tokens == 0);
  CHECK(options.user_functions == nullptr);
  for (const void* arg : options.user_args) CHECK(arg == nullptr);
  CHECK(options.block_mask == nullptr);
  CHECK(offsetof(flashjit_forward_options, sink_logits) >
        offsetof(flashjit_forward_options, window_right));
  CHECK(offsetof(flashjit_forward_options, alibi_slopes) ==
        offsetof(flashjit_forward_options, sink_logits) + sizeof(options.sink_logits));
  CHECK(offsetof(flashjit_forward_options, sink_tokens) ==
        offsetof(flashjit_forward_options, alibi_slopes) + sizeof(options.alibi_slopes));
  // sink_tokens, then padding up to the pointer alignment (4 bytes on 64-bit targets), then the
  // user functions' fields back to back.
  constexpr std::size_t align = alignof(flashjit_forward_options);
  constexpr std::size_t after_sink_tokens =
      offsetof(flashjit_forward_options, sink_tokens) + sizeof(int32_t);
  CHECK(offsetof(flashjit_forward_options, user_functions) ==
        (after_sink_tokens + align - 1) / align * align);
  CHECK(offsetof(flashjit_forward_options, user_args) ==
        offsetof(flashjit_forward_options, user_functions) + sizeof(void*));
  CHECK(sizeof(options.user_args) == FLASHJIT_MAX_USER_ARGS * sizeof(void*));
  CHECK(offsetof(flashjit_forward_options, block_mask) ==
        offsetof(flashjit_forward_options, user_args) + sizeof(options.user_args));
  CHECK(sizeof(flashjit_forward_options) ==
        offsetof(flashjit_forward_options, block_mask) + sizeof(void*));
  if (sizeof(void*) == 8) CHECK(sizeof(flashjit_forward_options) == 176);
}

TEST_CASE("user functions: a handle with the C++ hash; errors name the argument; no GPU") {
  const char* mask_mod =
      "__device__ bool mask_mod(int b, int h, int q, int k, const flashjit::UserArgs& a) {\n"
      "  const int* doc = static_cast<const int*>(a.ptr[0]);\n  return doc[q] == doc[k];\n}\n";
  flashjit_user_functions* functions = nullptr;
  REQUIRE(flashjit_user_functions_create(nullptr, mask_mod, nullptr, &functions) == FLASHJIT_OK);
  REQUIRE(functions != nullptr);
  const std::string hash = flashjit_user_functions_hash(functions);
  CHECK(hash == flashjit::UserFunctions("", mask_mod).hash());
  // "" is absent too, and the hash tells score_mod from mask_mod.
  flashjit_user_functions* same = nullptr;
  REQUIRE(flashjit_user_functions_create("", mask_mod, "", &same) == FLASHJIT_OK);
  CHECK(std::string(flashjit_user_functions_hash(same)) == hash);
  flashjit_user_functions_destroy(same);
  flashjit_user_functions* swapped = nullptr;
  REQUIRE(flashjit_user_functions_create(mask_mod, nullptr, nullptr, &swapped) == FLASHJIT_OK);
  CHECK(std::string(flashjit_user_functions_hash(swapped)) != hash);
  flashjit_user_functions_destroy(swapped);
  CHECK(flashjit_user_functions_hash(nullptr) == nullptr);

  // Files: the same hash as the text; a missing file is named.
  flashjit::test::TempDir dir;
  const auto file = dir.path() / "doc_mask.cu";
  std::ofstream(file) << mask_mod;
  flashjit_user_functions* from_file = nullptr;
  REQUIRE(flashjit_user_functions_from_files(nullptr, file.c_str(), nullptr, &from_file) == FLASHJIT_OK);
  CHECK(std::string(flashjit_user_functions_hash(from_file)) == hash);
  flashjit_user_functions_destroy(from_file);
  const auto missing = (dir.path() / "missing.cu").string();
  flashjit_user_functions* none = functions;
  CHECK(flashjit_user_functions_from_files(missing.c_str(), "", "", &none) ==
        FLASHJIT_INVALID_ARGUMENT);
  CHECK(none == nullptr);
  CHECK(std::string(flashjit_last_error()).find("score_mod file " + missing) !=
        std::string::npos);
  CHECK(flashjit_user_functions_create(nullptr, "", nullptr, &none) == FLASHJIT_INVALID_ARGUMENT);
  CHECK(std::string(flashjit_last_error()).find("both empty") != std::string::npos);
  // A derivative needs its score_mod; with one it changes the hash (the backward's kernels
  // compile it), without one the hash is what it was.
  CHECK(flashjit_user_functions_create(nullptr, mask_mod, "float score_mod_grad() {}", &none) ==
        FLASHJIT_INVALID_ARGUMENT);
  CHECK(std::string(flashjit_last_error()).find("score_mod_grad is given without a score_mod") !=
        std::string::npos);
  const char* bias = "float score_mod(float s, int, int, int, int, const flashjit::UserArgs&) "
                     "{ return s + 1.f; }";
  const char* bias_grad = "float score_mod_grad(float, int, int, int, int, "
                          "const flashjit::UserArgs&) { return 1.f; }";
  flashjit_user_functions* with_grad = nullptr;
  REQUIRE(flashjit_user_functions_create(bias, mask_mod, bias_grad, &with_grad) == FLASHJIT_OK);
  CHECK(std::string(flashjit_user_functions_hash(with_grad)) ==
        flashjit::UserFunctions(bias, mask_mod, bias_grad).hash());
  CHECK(std::string(flashjit_user_functions_hash(with_grad)) !=
        flashjit::UserFunctions(bias, mask_mod).hash());
  flashjit_user_functions_destroy(with_grad);
  CHECK(flashjit_user_functions_create(nullptr, mask_mod, nullptr, nullptr) == FLASHJIT_INVALID_ARGUMENT);
  CHECK(std::string(flashjit_last_error()).find("out is null") != std::string::npos);

  // A handle made here lets flashjit_precompile build a variant that names its hash.
  const std::string name = "simt.sm80.fp16.d64.m64n64s1.causal.user" + hash;
  const char* names[] = {name.c_str()};
  CHECK(flashjit_precompile(dir.path().c_str(), names, 1) == FLASHJIT_INVALID_ARGUMENT);
  CHECK(std::string(flashjit_last_error()).find("no variants with user functions") !=
        std::string::npos);
  flashjit_user_functions_destroy(functions);
}

TEST_CASE("block masks: null handles and outputs are invalid arguments naming them") {
  flashjit_block_mask* mask = nullptr;
  CHECK(flashjit_block_mask_create(nullptr, nullptr, nullptr, nullptr, nullptr, nullptr, 0, 0,
                                   nullptr, nullptr) == FLASHJIT_INVALID_ARGUMENT);
  CHECK(std::string(flashjit_last_error()).find("mask is null") != std::string::npos);
  CHECK(flashjit_block_mask_create_kv(nullptr, nullptr, nullptr, nullptr, nullptr, 1, 1, nullptr,
                                      &mask) == FLASHJIT_INVALID_ARGUMENT);
  CHECK(std::string(flashjit_last_error()).find("engine is null") != std::string::npos);
  CHECK(mask == nullptr);
  CHECK(flashjit_block_mask_create_varlen(nullptr, nullptr, nullptr, nullptr, nullptr, nullptr, 0,
                                          0, nullptr, &mask) == FLASHJIT_INVALID_ARGUMENT);
  std::int64_t partial = -1;
  CHECK(flashjit_block_mask_counts(nullptr, &partial, nullptr, nullptr) ==
        FLASHJIT_INVALID_ARGUMENT);
  CHECK(std::string(flashjit_last_error()).find("mask is null") != std::string::npos);
  CHECK(partial == -1);
  char name[8];
  CHECK(flashjit_block_mask_variant(nullptr, name, sizeof name) == FLASHJIT_INVALID_ARGUMENT);
  flashjit_block_mask_destroy(nullptr);  // like free(NULL)
}

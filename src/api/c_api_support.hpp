// What the C API's files share: a C++ exception turned into a status and the thread's last error,
// and the conversions of its handles and structs into the C++ API's.
#pragma once

#include <cstdint>
#include <memory>
#include <string>

#include "flashjit/flashjit.h"
#include "flashjit/flashjit.hpp"

struct flashjit_engine {
  std::unique_ptr<flashjit::Engine> engine;
};

struct flashjit_user_functions {
  flashjit::UserFunctions functions;
};

struct flashjit_block_mask {
  flashjit::BlockMask mask;
};

namespace flashjit::detail::c_api {

// What flashjit_last_error() returns: the message of this thread's last failed call.
std::string& last_error();

flashjit_status status_of(ErrorCode code);

// Runs `body`, turning exceptions into a status and the thread's last error.
template <typename Body>
flashjit_status guarded(Body&& body) {
  try {
    body();
    last_error().clear();
    return FLASHJIT_OK;
  } catch (const Error& e) {
    last_error() = e.what();
    return status_of(e.code());
  } catch (const std::exception& e) {
    last_error() = e.what();
    return FLASHJIT_INTERNAL_ERROR;
  }
}

// Throws Error(invalid_argument, message) unless `condition`.
void require(bool condition, const char* message);

// The engine behind a handle, or Error(invalid_argument) for a null one.
Engine& engine_of(flashjit_engine* engine);

// A flashjit_tensor as a TensorView; Error(invalid_argument) naming `name` for a null one or a
// dtype that is neither FLASHJIT_BF16 nor FLASHJIT_FP16.
TensorView view_of(const flashjit_tensor* t, const char* name);

// A flashjit_varlen as a VarlenBatch; Error(invalid_argument) for a null one.
VarlenBatch varlen_of(const flashjit_varlen* v);

// A block mask made by `make` (one of Engine::create_block_mask's or
// create_backward_block_mask's overloads, given the BlockMaskOptions) into *mask.
template <typename Make>
flashjit_status make_block_mask(flashjit_block_mask** mask, int32_t same_for_all_heads,
                                int32_t same_for_all_batches, Make&& make) {
  return guarded([&] {
    require(mask != nullptr, "mask is null: expected a flashjit_block_mask** to fill");
    *mask = nullptr;
    BlockMaskOptions mask_options;
    mask_options.same_for_all_heads = same_for_all_heads != 0;
    mask_options.same_for_all_batches = same_for_all_batches != 0;
    *mask = new flashjit_block_mask{make(mask_options)};
  });
}

// Copies a variant's name into a caller's buffer (NUL-terminated), or throws naming buf_size.
void write_name(const std::string& name, char* buf, int32_t buf_size);

}  // namespace flashjit::detail::c_api

// The text that stands in for kernels_src/common/user_functions.cuh in a variant with user
// functions: the caller's score_mod, mask_mod and score_mod_grad, each numbered from its own line 1 so NVRTC's
// messages point at the caller's lines ("score_mod(3): error: ..."), and the flags the kernels
// test.
#pragma once

#include <string>
#include <string_view>
#include <vector>

#include "jit/kernel_sources.hpp"

#include "flashjit/flashjit.hpp"

namespace flashjit::detail {

// The kernel source file it replaces.
inline constexpr const char* kUserFunctionsFile = "common/user_functions.cuh";

// Any may be empty (absent), as in UserFunctions.
std::string user_functions_source(std::string_view score_mod, std::string_view mask_mod,
                                  std::string_view score_mod_grad);

// The translation unit of a variant: kernel_translation_unit's, with the variant's user functions
// (a UserFunctions made in this process) in place of the default file. Throws
// Error(compile_failed) when no UserFunctions of the variant's hash was made here.
std::vector<SourceFile> with_user_functions(std::vector<SourceFile> unit, const Variant& variant);
// Whether the variant's user functions (made in this process) have a mask_mod: only those kernels
// get a block-mask entry (KernelSpec::block_mask_name_expression).
bool has_mask_mod(const Variant& variant);
// What the content key of a variant with user functions takes besides its name (which holds
// their hash): this generator's text around them, so a change to it is a new key.
SourceFile user_functions_template();

}  // namespace flashjit::detail

// User functions (UserFunctions, Variant::user_functions): every one made in this process, by
// hash, so that a variant naming a hash can be compiled wherever it is asked for (forward,
// KernelCache::compile, the CLI's precompile).
#pragma once

#include <array>
#include <cstdint>
#include <optional>
#include <string_view>

#include "flashjit/flashjit.hpp"

namespace flashjit::detail {

// The UserFunctions of this hash made in this process; nullopt when none was.
std::optional<UserFunctions> registered_user_functions(std::string_view hash);
// Empty when `hash` has the form of UserFunctions::hash() (32 lowercase hex digits), else what is
// wrong.
std::string check_user_functions_hash(std::string_view hash);
// A hash as two numbers (hot-path keys compare these, not strings); {0, 0} for an empty one.
std::array<std::uint64_t, 2> user_functions_key(std::string_view hash);

}  // namespace flashjit::detail

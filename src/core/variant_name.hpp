// A variant's canonical name, "<family>.<arch>.<dtype>.d<head_dim>.m<M>n<N>s<stages>[.causal]",
// read back field by field. Syntax only: whether the family exists and can build the variant is
// the registry's check (src/families/registry.hpp), which Variant::parse adds.
#pragma once

#include <string_view>

#include "flashjit/flashjit.hpp"

namespace flashjit::detail {
// Throws Error(invalid_argument) naming the field that is malformed.
Variant parse_variant_name(std::string_view name);
}  // namespace flashjit::detail

// Variant::parse: the name's syntax (core), then the registry's check, so a name parses exactly
// when its variant can be built and run.
#include <fmt/format.h>

#include "core/variant_name.hpp"
#include "families/registry.hpp"
#include "flashjit/flashjit.hpp"

namespace flashjit {

Variant Variant::parse(std::string_view name) {
  Variant variant = detail::parse_variant_name(name);
  if (detail::find_family(variant.family) == nullptr)
    throw Error(ErrorCode::invalid_argument,
                fmt::format("bad variant name '{}': family field: {}", name,
                            detail::unknown_family(variant.family)));
  detail::check_variant(variant);
  return variant;
}

}  // namespace flashjit

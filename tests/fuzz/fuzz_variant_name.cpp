// Fuzzes the names a user, a cache file name or the CLI can hand us: Variant::parse and
// normalize_arch. Any text either parses to something that round-trips or is rejected with
// Error(invalid_argument); nothing else may happen (no other exception, no UB, no crash).
#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <string>
#include <string_view>

#include "core/arch.hpp"
#include "flashjit/flashjit.hpp"
#include "invariant.hpp"

using flashjit::Error;
using flashjit::ErrorCode;
using flashjit::fuzz::invariant;

namespace {

void check_rejection(const Error& error, std::string_view text) {
  invariant(error.code() == ErrorCode::invalid_argument,
            "rejection of '" + std::string(text) + "' is not invalid_argument: " + error.what());
  invariant(std::string_view(error.what()).size() > 0, "rejection without a message");
}

void fuzz_variant_parse(std::string_view text) {
  flashjit::Variant variant;
  try {
    variant = flashjit::Variant::parse(text);
  } catch (const Error& error) {
    check_rejection(error, text);
    return;
  }
  // Accepted text may spell numbers differently ("d0128"), but its canonical name parses back to
  // the same variant and is a fixed point: cache file names stay stable.
  const std::string name = variant.name();
  const flashjit::Variant again = flashjit::Variant::parse(name);
  invariant(again == variant, "'" + name + "' parses to a different variant");
  invariant(again.name() == name, "canonical name '" + name + "' is not a fixed point");
  invariant(variant.head_dim > 0 && variant.tile_m > 0 && variant.tile_n > 0 && variant.stages > 0,
            "'" + name + "' accepted with a non-positive size");
}

void fuzz_normalize_arch(std::string_view text) {
  std::string arch;
  try {
    arch = flashjit::normalize_arch(text);
  } catch (const Error& error) {
    check_rejection(error, text);
    return;
  }
  const auto& known = flashjit::detail::known_archs();
  invariant(std::find(known.begin(), known.end(), arch) != known.end(),
            "'" + std::string(text) + "' normalized to unknown arch '" + arch + "'");
  invariant(flashjit::normalize_arch(arch) == arch, "'" + arch + "' is not a fixed point");
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  const std::string_view text(reinterpret_cast<const char*>(data), size);
  fuzz_variant_parse(text);
  fuzz_normalize_arch(text);
  return 0;
}

#include "jit/content_key.hpp"

#include <fmt/format.h>
#include <xxhash.h>

#include <string_view>

namespace flashjit::detail {

std::string content_key(const KeyInputs& inputs) {
  XXH3_state_t* state = XXH3_createState();
  XXH3_128bits_reset(state);
  auto feed = [&](std::string_view text) {
    XXH3_128bits_update(state, text.data(), text.size());
    XXH3_128bits_update(state, "\0", 1);
  };
  feed(inputs.flashjit_version);
  feed(inputs.nvrtc_version);
  feed(inputs.variant_name);
  feed(inputs.name_expression);
  feed(inputs.block_mask_name_expression);
  for (const auto& option : inputs.options) feed(option);
  for (const auto& file : inputs.sources) {
    feed(file.path);
    feed(file.text);
  }
  const XXH128_hash_t hash = XXH3_128bits_digest(state);
  XXH3_freeState(state);
  return fmt::format("{:016x}{:016x}", hash.high64, hash.low64);
}

}  // namespace flashjit::detail

#include "jit/compiled_kernel.hpp"

#include <fmt/format.h>
#include <xxhash.h>

#include <nlohmann/json.hpp>
#include <utility>

#include "core/variant_name.hpp"

namespace flashjit::detail {
namespace {
using nlohmann::json;

// An integer field that fits T. nlohmann's get<int>() converts a float such as 1e300, or an
// integer out of range, with undefined behaviour; metadata on disk can hold either.
template <typename T>
T integer_field(const json& doc, const char* key) {
  const json& value = doc.at(key);
  const bool fits = value.is_number_unsigned()  ? std::in_range<T>(value.get<std::uint64_t>())
                    : value.is_number_integer() ? std::in_range<T>(value.get<std::int64_t>())
                                                : false;
  if (!fits)
    throw std::out_of_range(
        fmt::format("{} is {}: expected an integer in range", key, value.dump()));
  return value.get<T>();
}

}  // namespace

std::string cubin_hash(std::string_view cubin) {
  return fmt::format("{:016x}", XXH3_64bits(cubin.data(), cubin.size()));
}

bool CompiledKernel::describes(std::string_view bytes) const {
  return bytes.size() == entry.cubin_bytes && cubin_hash(bytes) == cubin_xxh3;
}

std::string metadata_json(const CompiledKernel& k, std::string_view cubin) {
  const CacheEntry& e = k.entry;
  const Variant& v = e.variant;
  return json{{"name", v.name()},
              {"family", v.family},
              {"arch", v.arch},
              {"dtype", to_string(v.dtype)},
              {"head_dim", v.head_dim},
              {"tile_m", v.tile_m},
              {"tile_n", v.tile_n},
              {"stages", v.stages},
              {"causal", v.causal},
              {"softcap", v.softcap},
              {"window", v.window},
              {"sink", v.sink},
              {"alibi", v.alibi},
              {"user_functions", v.user_functions},  // their hash ("" for none), as in the name
              {"key", k.key},
              {"lowered_name", k.lowered_name},
              {"block_mask_lowered_name", k.block_mask_lowered_name},
              {"registers", e.registers},
              {"spill_bytes", e.spill_bytes},
              {"static_shared_bytes", e.static_shared_bytes},
              {"dynamic_shared_bytes", e.dynamic_shared_bytes},
              {"compile_ms", e.compile_ms},
              {"nvrtc_version", e.nvrtc_version},
              {"flashjit_version", e.flashjit_version},
              {"created", e.created},
              {"cubin_bytes", cubin.size()},
              {"cubin_xxh3", cubin_hash(cubin)},
              {"log", k.log}}
      .dump(1);
}

std::optional<CompiledKernel> parse_metadata(std::string_view json_text, std::string* why) {
  try {
    const json doc = json::parse(json_text);
    CompiledKernel k;
    CacheEntry& e = k.entry;
    e.variant = parse_variant_name(doc.at("name").get<std::string>());
    k.key = doc.at("key").get<std::string>();
    e.key = k.key.substr(0, 16);
    k.lowered_name = doc.at("lowered_name").get<std::string>();
    k.block_mask_lowered_name = doc.value("block_mask_lowered_name", "");
    e.registers = integer_field<int>(doc, "registers");
    e.spill_bytes = integer_field<int>(doc, "spill_bytes");
    e.static_shared_bytes = integer_field<int>(doc, "static_shared_bytes");
    e.dynamic_shared_bytes = integer_field<int>(doc, "dynamic_shared_bytes");
    e.compile_ms = doc.at("compile_ms").get<double>();
    e.created = doc.at("created").get<std::string>();
    k.log = doc.value("log", "");
    e.cubin_bytes = integer_field<std::size_t>(doc, "cubin_bytes");
    k.cubin_xxh3 = doc.at("cubin_xxh3").get<std::string>();
    e.nvrtc_version = doc.at("nvrtc_version").get<std::string>();
    e.flashjit_version = doc.at("flashjit_version").get<std::string>();
    return k;
  } catch (const std::exception& e) {
    if (why) *why = e.what();
    return std::nullopt;
  }
}

}  // namespace flashjit::detail

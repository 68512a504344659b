// Fuzzes what the disk cache reads back from disk: an entry's .json and its .cubin, which a torn
// write, a foreign tool or a bad disk can make into anything. Input: metadata text, a NUL byte,
// then the cubin bytes. The parser must reject bad text with a reason (never throw or crash);
// DiskCache::load must serve the entry exactly when the cubin is the one the metadata describes,
// and must remove it otherwise; list() must agree with load().
#include <unistd.h>

#include <cstddef>
#include <cstdint>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <string>
#include <string_view>

#include "core/variant_name.hpp"
#include "invariant.hpp"
#include "jit/cubin_check.hpp"
#include "jit/disk_cache.hpp"

namespace fs = std::filesystem;
using flashjit::detail::CompiledKernel;
using flashjit::detail::DiskCache;
using flashjit::fuzz::invariant;

namespace {

// Discarded entries log a warning each; the fuzzer would spend its time printing them.
const bool quiet = ::setenv("FLASHJIT_LOG_LEVEL", "off", 1) == 0;

// One cache directory for the whole run, emptied after every input.
struct ScratchCache {
  ScratchCache() {
    std::string pattern = (fs::temp_directory_path() / "flashjit-fuzz-XXXXXX").string();
    dir = ::mkdtemp(pattern.data());
    cache.emplace(flashjit::CacheOptions{dir});
  }
  ~ScratchCache() {
    std::error_code ec;
    fs::remove_all(dir, ec);
  }
  fs::path dir;
  std::optional<DiskCache> cache;
};

ScratchCache& scratch() {
  static ScratchCache instance;
  return instance;
}

// Keys come from key_for (32 hex digits), never from a file; only such keys name files here.
bool is_content_key(const std::string& key) {
  if (key.size() != 32) return false;
  for (char c : key)
    if (!((c >= '0' && c <= '9') || (c >= 'a' && c <= 'f'))) return false;
  return true;
}

void write_file(const fs::path& path, std::string_view bytes) {
  std::ofstream file(path, std::ios::binary | std::ios::trunc);
  file.write(bytes.data(), static_cast<std::streamsize>(bytes.size()));
  invariant(static_cast<bool>(file), "cannot write " + path.string());
}

// The entry as the cache would find it on disk: load() serves it iff the cubin matches.
void check_load(const CompiledKernel& meta, std::string_view json_text, std::string_view cubin) {
  ScratchCache& s = scratch();
  const std::string stem =
      (s.dir / (meta.entry.variant.name() + "." + meta.key.substr(0, 16))).string();
  write_file(stem + ".json", json_text);
  write_file(stem + ".cubin", cubin);

  const auto loaded = s.cache->load(meta.entry.variant, meta.key);
  const auto listed = s.cache->list(std::nullopt);
  // Served exactly when the cubin is the one described and a cubin for the variant's arch.
  if (meta.describes(cubin) &&
      flashjit::detail::cubin_mismatch(cubin, meta.entry.variant.arch).empty()) {
    invariant(loaded.has_value(), "a matching entry was not served");
    invariant(loaded->cubin == cubin, "served cubin differs from the one on disk");
    invariant(loaded->key == meta.key && loaded->entry.variant == meta.entry.variant,
              "served entry names another variant or key");
    invariant(listed.size() == 1 && listed[0].cubin_bytes == cubin.size(),
              "list() does not show the one valid entry");
  } else {
    invariant(!loaded.has_value(), "an entry whose cubin fails its hash or arch was served");
    invariant(!fs::exists(stem + ".json") && !fs::exists(stem + ".cubin"),
              "a bad entry was left on disk");
    invariant(listed.empty(), "list() shows a discarded entry");
  }
  std::error_code ec;
  for (const auto& item : fs::directory_iterator(s.dir, ec)) fs::remove(item.path(), ec);
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  (void)quiet;
  const std::string_view input(reinterpret_cast<const char*>(data), size);
  const std::size_t split = input.find('\0');
  const std::string_view json_text = input.substr(0, split);
  const std::string_view cubin =
      split == std::string_view::npos ? std::string_view() : input.substr(split + 1);

  std::string why;
  const auto meta = flashjit::detail::parse_metadata(json_text, &why);
  if (!meta) {
    invariant(!why.empty(), "metadata rejected without a reason");
    return 0;
  }
  invariant(flashjit::detail::parse_variant_name(meta->entry.variant.name()) == meta->entry.variant,
            "metadata variant does not round-trip");
  invariant(!meta->describes(cubin) || cubin.size() == meta->entry.cubin_bytes,
            "describes() accepted a cubin of the wrong size");
  if (is_content_key(meta->key)) check_load(*meta, json_text, cubin);
  return 0;
}

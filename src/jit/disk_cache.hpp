// The on-disk store of compiled kernels: one <name>.<key16>.cubin + .json pair per entry,
// published with temp file + fsync + rename (metadata last), read without locks, and verified
// against the cubin's hash on every load.
#pragma once

#include <chrono>
#include <filesystem>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "flashjit/flashjit.hpp"
#include "jit/compiled_kernel.hpp"

namespace flashjit::detail {

class DiskCache {
 public:
  // Resolves the directory ($FLASHJIT_CACHE_DIR, $XDG_CACHE_HOME/flashjit, ~/.cache/flashjit
  // unless `dir` is given). An unusable directory leaves the cache memory-only, with one warning.
  explicit DiskCache(std::optional<std::filesystem::path> dir);

  bool persistent() const { return persistent_; }
  const std::filesystem::path& directory() const { return dir_; }

  // The entry for (variant, key), or nullopt. A corrupt entry is removed with a warning.
  std::optional<CompiledKernel> load(const Variant& variant, const std::string& key) const;
  // Publishes atomically; returns an error message instead of throwing (the kernel stays usable).
  std::string store(const CompiledKernel& kernel) const;

  // Where the entry for (variant, key) keeps its cubin.
  std::filesystem::path cubin_path(const Variant& variant, const std::string& key) const;

  std::vector<CacheEntry> list(const std::optional<std::string>& arch) const;
  // Removes these entries (from list()); returns how many were still there.
  std::size_t remove(const std::vector<CacheEntry>& entries) const;
  std::size_t prune(std::uint64_t max_bytes) const;
  // Removes temp files that a killed writer left behind (older than `age`).
  void remove_stale_temps(std::chrono::seconds age) const;

 private:
  std::filesystem::path entry_stem(const Variant& variant, const std::string& key) const;

  std::filesystem::path dir_;
  bool persistent_ = false;
};

std::filesystem::path default_cache_dir();

}  // namespace flashjit::detail

// The on-disk store of compiled kernels, in layers: one writable directory, then read-only ones
// (bundles from `flashjit precompile --out`, baked into images). An entry is a
// <name>.<key16>.cubin + .json pair, published with temp file + fsync + link/rename (metadata
// last), read without locks, verified against its hash and its ELF arch on every load, and only
// read from directories and files that pass the trust rule (trusted_files.hpp, docs/cache.md).
#pragma once

#include <chrono>
#include <filesystem>
#include <mutex>
#include <optional>
#include <string>
#include <vector>

#include "flashjit/flashjit.hpp"
#include "jit/compiled_kernel.hpp"
#include "jit/trusted_files.hpp"

namespace flashjit::detail {

class DiskCache {
 public:
  struct Layer {
    std::filesystem::path dir;
    bool writable = false;
    TrustRule rule;
  };

  // Resolves and checks the layers (cache_location.hpp). A writable location that cannot be used
  // leaves the cache without a writable layer (memory-only for new kernels), with one warning.
  explicit DiskCache(const CacheOptions& options);

  bool persistent() const { return writable_ != nullptr; }  // has a writable layer
  // The writable layer's directory; empty when there is none.
  const std::filesystem::path& directory() const;
  // Why there is no writable layer (empty when there is one), naming the directory and its source.
  const std::string& why_not_persistent() const { return why_not_persistent_; }
  const std::vector<Layer>& layers() const { return layers_; }

  // The entry for (variant, key) from the first layer that has a valid one, or nullopt. A corrupt
  // entry of the writable layer is removed with a warning; one of a read-only layer is skipped.
  std::optional<CompiledKernel> load(const Variant& variant, const std::string& key) const;
  // Publishes into the writable layer; returns an error message instead of throwing (the kernel
  // stays usable). Nothing is written without a writable layer.
  std::string store(const CompiledKernel& kernel) const;
  // Where the writable layer keeps the cubin of (variant, key).
  std::filesystem::path cubin_path(const Variant& variant, const std::string& key) const;

  // Every layer's entries (CacheEntry::layer, ::read_only say where each is).
  std::vector<CacheEntry> list(const std::optional<std::string>& arch) const;
  // Removes these entries from the writable layer (read-only ones are never touched); returns
  // how many were still there.
  std::size_t remove(const std::vector<CacheEntry>& entries) const;
  std::size_t prune(std::uint64_t max_bytes) const;

 private:
  // Removes temp files that a killed writer of this user left in the writable layer, once they
  // are older than `age`; nothing else (no other name, no directory, nobody else's file).
  void remove_stale_temps(std::chrono::seconds age) const;
  std::vector<CacheEntry> list_layer(const Layer& layer,
                                     const std::optional<std::string>& arch) const;

  std::vector<Layer> layers_;
  const Layer* writable_ = nullptr;
  std::string why_not_persistent_;
  mutable std::once_flag temps_cleaned_;
};

}  // namespace flashjit::detail

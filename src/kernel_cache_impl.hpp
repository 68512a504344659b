// KernelCache internals: content keys, the in-process map that compiles each variant once even
// under concurrent requests, and the disk cache behind it.
#pragma once

#include <future>
#include <map>
#include <memory>
#include <mutex>

#include "compiler.hpp"
#include "disk_cache.hpp"
#include "flashjit/flashjit.hpp"

namespace flashjit {

struct KernelCache::Impl {
  explicit Impl(std::optional<std::filesystem::path> dir) : disk(std::move(dir)) {}

  // The compiled kernel for a variant: memory, then disk, then NVRTC. Concurrent callers for the
  // same variant share one compilation. Throws Error(compile_failed / invalid_argument).
  std::shared_ptr<const detail::CompiledKernel> get(const Variant& variant, bool* was_cached = nullptr);

  // Hash of everything the binary depends on: sources with includes, variant, options, NVRTC and
  // flashjit versions. 32 hex digits.
  std::string key_for(const Variant& variant);

  detail::DiskCache disk;
  std::mutex mutex;
  std::map<std::string, std::shared_future<std::shared_ptr<const detail::CompiledKernel>>> compiled;
  std::map<std::string, std::vector<detail::SourceFile>> units;  // by family source file
};

}  // namespace flashjit

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
namespace detail {

// Everything a compiled binary depends on; the content key hashes all of it.
struct KeyInputs {
  std::string flashjit_version;
  std::string nvrtc_version;
  std::string variant_name;
  std::string name_expression;
  std::vector<std::string> options;
  std::vector<SourceFile> sources;  // the translation unit: main file and its includes
};
// 32 hex digits of XXH3-128 over the inputs, each field separated so none can run into the next.
std::string content_key(const KeyInputs& inputs);

}  // namespace detail

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

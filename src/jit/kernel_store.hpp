// Compiled kernels of this process: memory, then the disk cache, then NVRTC. Each kernel is
// compiled once however many threads ask at once; the store knows kernels only by KernelSpec.
#pragma once

#include <filesystem>
#include <map>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <vector>

#include "core/once_map.hpp"
#include "flashjit/flashjit.hpp"
#include "jit/compiled_kernel.hpp"
#include "jit/disk_cache.hpp"
#include "jit/kernel_sources.hpp"
#include "jit/kernel_spec.hpp"

namespace flashjit::detail {

class KernelStore {
 public:
  explicit KernelStore(const CacheOptions& options) : disk_(options) {}

  // The kernel `spec` describes, named `variant`. `*was_cached` (optional): served from memory or
  // disk, no NVRTC run. Throws Error(compile_failed).
  std::shared_ptr<const CompiledKernel> get(const Variant& variant, const KernelSpec& spec,
                                            bool* was_cached = nullptr);
  // The kernel if it needs no compile: in memory already, or on disk (loaded now). Else nullptr.
  std::shared_ptr<const CompiledKernel> get_if_built(const Variant& variant,
                                                     const KernelSpec& spec);
  // The content key (32 hex digits) of what `spec` would compile for `variant`.
  std::string key_for(const Variant& variant, const KernelSpec& spec);

  const DiskCache& disk() const { return disk_; }

 private:
  std::vector<SourceFile> translation_unit(const std::string& source_file);

  DiskCache disk_;
  OnceMap<std::string, std::shared_ptr<const CompiledKernel>> compiled_;  // by variant name
  std::mutex units_mutex_;
  std::map<std::string, std::vector<SourceFile>> units_;  // by main source file
};

}  // namespace flashjit::detail

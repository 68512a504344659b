// Loaded modules per CUDA context: each (context, variant) is loaded once, even when many threads
// ask at the same moment; the kernel's dynamic shared-memory limit is raised at load.
#pragma once

#include <cuda.h>

#include <future>
#include <map>
#include <memory>
#include <mutex>
#include <string>

#include "compiler.hpp"

namespace flashjit::detail {

struct LoadedKernel {
  CUmodule module = nullptr;
  CUfunction function = nullptr;
};

class ModuleCache {
 public:
  ModuleCache() = default;
  ~ModuleCache();
  ModuleCache(const ModuleCache&) = delete;
  ModuleCache& operator=(const ModuleCache&) = delete;

  // `context` must be current on the calling thread.
  LoadedKernel get(CUcontext context, const CompiledKernel& kernel);

 private:
  using Key = std::pair<CUcontext, std::string>;
  std::mutex mutex_;
  std::map<Key, std::shared_future<LoadedKernel>> loaded_;
};

// Makes `context` current for a scope, restoring the caller's afterwards.
class ScopedContext {
 public:
  explicit ScopedContext(CUcontext context);
  ~ScopedContext();
  ScopedContext(const ScopedContext&) = delete;
  ScopedContext& operator=(const ScopedContext&) = delete;

 private:
  bool pushed_ = false;
};

}  // namespace flashjit::detail

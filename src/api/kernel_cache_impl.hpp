// KernelCache's state: the JIT's kernel store, fed specs by the family registry. Engine fetches
// its kernels through the same object, so the two never compile one variant twice.
#pragma once

#include <memory>

#include "flashjit/flashjit.hpp"
#include "jit/kernel_store.hpp"

namespace flashjit {

// Hidden like everything internal (a nested class takes its enclosing class's visibility).
struct __attribute__((visibility("hidden"))) KernelCache::Impl {
  explicit Impl(const CacheOptions& options) : store(options) {}

  // The checked variant's kernel: memory, disk, then NVRTC. Throws Error(invalid_argument /
  // compile_failed).
  std::shared_ptr<const detail::CompiledKernel> get(const Variant& variant,
                                                    bool* was_cached = nullptr);

  // The checked variant's kernel if it needs no NVRTC run (memory or disk), else nullptr.
  std::shared_ptr<const detail::CompiledKernel> get_if_built(const Variant& variant);

  detail::KernelStore store;
};

}  // namespace flashjit

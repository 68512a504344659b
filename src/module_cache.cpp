#include "module_cache.hpp"

#include "driver.hpp"
#include "log.hpp"

namespace flashjit::detail {

namespace {
constexpr int kDefaultDynamicSharedLimit = 48 * 1024;
}

LoadedKernel ModuleCache::get(CUcontext context, const CompiledKernel& kernel) {
  const Key key{context, kernel.variant.name()};
  std::promise<LoadedKernel> promise;
  std::shared_future<LoadedKernel> future;
  {
    std::lock_guard lock(mutex_);
    auto it = loaded_.find(key);
    if (it != loaded_.end()) return it->second.get();
    future = promise.get_future().share();
    loaded_.emplace(key, future);
  }
  try {
    const DriverApi& cu = driver();
    LoadedKernel loaded;
    check(cu.cuModuleLoadData(&loaded.module, kernel.cubin.data()), "cuModuleLoadData");
    check(cu.cuModuleGetFunction(&loaded.function, loaded.module, kernel.lowered_name.c_str()),
          "cuModuleGetFunction");
    if (kernel.dynamic_shared_bytes > kDefaultDynamicSharedLimit)
      check(cu.cuFuncSetAttribute(loaded.function, CU_FUNC_ATTRIBUTE_MAX_DYNAMIC_SHARED_SIZE_BYTES,
                                  kernel.dynamic_shared_bytes),
            "cuFuncSetAttribute(MAX_DYNAMIC_SHARED_SIZE_BYTES)");
    log().debug("loaded {} into context {}", kernel.variant.name(), static_cast<void*>(context));
    promise.set_value(loaded);
    return loaded;
  } catch (...) {
    promise.set_exception(std::current_exception());
    std::lock_guard lock(mutex_);
    loaded_.erase(key);
    throw;
  }
}

ModuleCache::~ModuleCache() {
  if (!driver_available()) return;
  for (auto& [key, future] : loaded_) {
    if (future.wait_for(std::chrono::seconds(0)) != std::future_status::ready) continue;
    try {
      ScopedContext scope(key.first);
      driver().cuModuleUnload(future.get().module);
    } catch (...) {
      // A context torn down by the application takes its modules with it.
    }
  }
}

ScopedContext::ScopedContext(CUcontext context) {
  const DriverApi& cu = driver();
  CUcontext current = nullptr;
  check(cu.cuCtxGetCurrent(&current), "cuCtxGetCurrent");
  if (current != context) {
    check(cu.cuCtxPushCurrent(context), "cuCtxPushCurrent");
    pushed_ = true;
  }
}

ScopedContext::~ScopedContext() {
  if (pushed_) {
    CUcontext popped = nullptr;
    driver().cuCtxPopCurrent(&popped);
  }
}

}  // namespace flashjit::detail

#include "cuda/modules.hpp"

#include "core/log.hpp"
#include "cuda/context.hpp"
#include "cuda/driver.hpp"

namespace flashjit::detail {

namespace {
constexpr int kDefaultDynamicSharedLimit = 48 * 1024;
}

LoadedKernel ModuleCache::get(CUcontext context, const ModuleImage& image) {
  return loaded_.get({context, std::string(image.key)}, [&] {
    const DriverApi& cu = driver();
    LoadedKernel loaded;
    check(cu.cuModuleLoadData(&loaded.module, image.cubin.data()), "cuModuleLoadData");
    auto entry = [&](std::string_view name) {
      CUfunction function = nullptr;
      check(cu.cuModuleGetFunction(&function, loaded.module, std::string(name).c_str()),
            "cuModuleGetFunction");
      const int shared_bytes = image.dynamic_shared_bytes;
      if (shared_bytes > kDefaultDynamicSharedLimit)
        check(cu.cuFuncSetAttribute(function, CU_FUNC_ATTRIBUTE_MAX_DYNAMIC_SHARED_SIZE_BYTES,
                                    shared_bytes),
              "cuFuncSetAttribute(MAX_DYNAMIC_SHARED_SIZE_BYTES)");
      return function;
    };
    loaded.function = entry(image.entry_point);
    if (!image.block_mask_entry_point.empty())
      loaded.block_mask_function = entry(image.block_mask_entry_point);
    log().debug("loaded {} into context {}", image.entry_point, static_cast<void*>(context));
    return loaded;
  });
}

ModuleCache::~ModuleCache() {
  if (!driver_available()) return;
  loaded_.for_each_ready([](const auto& key, const LoadedKernel& loaded) {
    try {
      ScopedContext scope(key.first);
      driver().cuModuleUnload(loaded.module);
    } catch (...) {
      // A context torn down by the application takes its modules with it.
    }
  });
}

}  // namespace flashjit::detail

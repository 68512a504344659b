#include "cuda/modules.hpp"

#include "core/log.hpp"
#include "cuda/context.hpp"
#include "cuda/driver.hpp"

namespace flashjit::detail {

namespace {
// A block's shared memory, static and dynamic together, past which a kernel must opt in.
constexpr int kDefaultSharedLimit = 48 * 1024;
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
      // The static part counts too: bwd_mma's varlen kernels at d32 take exactly 48 KiB
      // dynamic plus 32 bytes static, which the driver refused to launch without the opt-in.
      int static_bytes = 0;
      check(cu.cuFuncGetAttribute(&static_bytes, CU_FUNC_ATTRIBUTE_SHARED_SIZE_BYTES, function),
            "cuFuncGetAttribute(SHARED_SIZE_BYTES)");
      if (shared_bytes + static_bytes > kDefaultSharedLimit)
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

#include "cuda/driver.hpp"

#include <dlfcn.h>
#include <fmt/format.h>

#include <mutex>

#include "flashjit/flashjit.hpp"

namespace flashjit::detail {
namespace {

#define FLASHJIT_STRINGIFY_EXPANDED(x) FLASHJIT_STRINGIFY(x)
#define FLASHJIT_STRINGIFY(x) #x

struct LoadResult {
  DriverApi api;
  std::string error;  // empty on success
};

LoadResult load() {
  LoadResult result;
  void* handle = dlopen("libcuda.so.1", RTLD_NOW | RTLD_LOCAL);
  if (handle == nullptr) {
    result.error = fmt::format("no CUDA driver found (dlopen libcuda.so.1: {})", dlerror());
    return result;
  }
#define FLASHJIT_RESOLVE(name)                                                                     \
  result.api.name =                                                                                \
      reinterpret_cast<decltype(&::name)>(dlsym(handle, FLASHJIT_STRINGIFY_EXPANDED(name)));       \
  if (result.api.name == nullptr) {                                                                \
    result.error =                                                                                 \
        fmt::format("the CUDA driver is too old: it lacks {}", FLASHJIT_STRINGIFY_EXPANDED(name)); \
    return result;                                                                                 \
  }
  FLASHJIT_DRIVER_CALLS(FLASHJIT_RESOLVE)
#undef FLASHJIT_RESOLVE
  CUresult init = result.api.cuInit(0);
  if (init == CUDA_ERROR_NO_DEVICE) {
    result.error = "no CUDA device (cuInit: CUDA_ERROR_NO_DEVICE)";
  } else if (init != CUDA_SUCCESS) {
    const char* name = "unknown";
    result.api.cuGetErrorName(init, &name);
    result.error = fmt::format("the CUDA driver failed to initialize (cuInit: {})", name);
  }
  return result;
}

const LoadResult& loaded() {
  static const LoadResult result = load();
  return result;
}

}  // namespace

const DriverApi& driver() {
  const LoadResult& result = loaded();
  if (!result.error.empty()) {
    bool no_device = result.error.rfind("no CUDA device", 0) == 0;
    throw Error(no_device ? ErrorCode::no_device : ErrorCode::no_driver, result.error);
  }
  return result.api;
}

bool driver_available() { return loaded().error.empty(); }

std::string describe(CUresult result, const char* call) {
  // The driver has no name for a code it does not know (it leaves the pointer null): the number.
  const char* name = nullptr;
  const char* text = nullptr;
  if (driver_available()) {
    if (loaded().api.cuGetErrorName(result, &name) != CUDA_SUCCESS) name = nullptr;
    if (loaded().api.cuGetErrorString(result, &text) != CUDA_SUCCESS) text = nullptr;
  }
  const std::string code = fmt::format("CUresult {}", static_cast<int>(result));
  return fmt::format("{} failed: {} ({})", call, name ? name : code.c_str(),
                     text ? text : "no description from the driver");
}

void check(CUresult result, const char* call) {
  if (result != CUDA_SUCCESS) throw Error(ErrorCode::cuda_error, describe(result, call));
}

}  // namespace flashjit::detail

// libcuda loaded with dlopen at first use, so the library loads and compiles with no driver.
// driver() returns the table of entry points we call, or throws Error(no_driver).
#pragma once

#include <cuda.h>

#include <string>

namespace flashjit::detail {

// The driver calls flashjit uses. cuda.h maps some names to their _v2 ABI symbols by macro; the
// members take the mapped names, so call sites read like plain driver calls.
// clang-format off
#define FLASHJIT_DRIVER_CALLS(X)                                                                \
  X(cuInit) X(cuDriverGetVersion) X(cuGetErrorName) X(cuGetErrorString)                         \
  X(cuDeviceGet) X(cuDeviceGetCount) X(cuDeviceGetName) X(cuDeviceGetAttribute)                 \
  X(cuDeviceTotalMem) X(cuDevicePrimaryCtxRetain) X(cuDevicePrimaryCtxRelease)                  \
  X(cuCtxGetCurrent) X(cuCtxPushCurrent) X(cuCtxPopCurrent) X(cuCtxGetDevice)                   \
  X(cuCtxSynchronize) X(cuStreamGetCtx) X(cuStreamSynchronize) X(cuStreamCreate)                \
  X(cuStreamDestroy) X(cuModuleLoadData) X(cuModuleUnload) X(cuModuleGetFunction)               \
  X(cuFuncSetAttribute) X(cuFuncGetAttribute) X(cuLaunchKernel) X(cuLaunchKernelEx)             \
  X(cuTensorMapEncodeTiled) X(cuTensorMapReplaceAddress) X(cuMemAlloc) X(cuMemFree)             \
  X(cuMemcpyHtoD) X(cuMemcpyDtoH) X(cuMemsetD8) X(cuMemsetD32) X(cuMemsetD8Async)             \
  X(cuStreamIsCapturing) X(cuMemGetInfo) X(cuEventCreate) X(cuEventRecord)                      \
  X(cuEventSynchronize) X(cuEventElapsedTime) X(cuEventDestroy)
// clang-format on

struct DriverApi {
#define FLASHJIT_DECLARE(name) decltype(&::name) name = nullptr;
  FLASHJIT_DRIVER_CALLS(FLASHJIT_DECLARE)
#undef FLASHJIT_DECLARE
};

// Loads libcuda (once) and cuInit()s it. Throws Error(no_driver) with the reason.
const DriverApi& driver();
bool driver_available();

// "cuLaunchKernelEx failed: CUDA_ERROR_INVALID_VALUE (invalid argument)".
std::string describe(CUresult result, const char* call);
// Throws Error(cuda_error) on failure.
void check(CUresult result, const char* call);

}  // namespace flashjit::detail

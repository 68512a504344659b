#include "cuda/context.hpp"

#include "cuda/driver.hpp"

namespace flashjit::detail {

PrimaryContext::PrimaryContext(int ordinal) {
  const DriverApi& cu = driver();
  check(cu.cuDeviceGet(&device_, ordinal), "cuDeviceGet");
  check(cu.cuDevicePrimaryCtxRetain(&context_, device_), "cuDevicePrimaryCtxRetain");
}

PrimaryContext::~PrimaryContext() { driver().cuDevicePrimaryCtxRelease(device_); }

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

namespace flashjit::detail {

LaunchContext::LaunchContext(CUstream stream, CUcontext fallback) {
  const DriverApi& cu = driver();
  CUcontext current = nullptr;
  check(cu.cuCtxGetCurrent(&current), "cuCtxGetCurrent");
  if (stream != nullptr) check(cu.cuStreamGetCtx(stream, &context_), "cuStreamGetCtx");
  else context_ = current;
  if (context_ == nullptr) context_ = fallback;
  if (context_ != current) {
    check(cu.cuCtxPushCurrent(context_), "cuCtxPushCurrent");
    pushed_ = true;
  }
}

LaunchContext::~LaunchContext() {
  if (pushed_) {
    CUcontext popped = nullptr;
    driver().cuCtxPopCurrent(&popped);
  }
}

}  // namespace flashjit::detail

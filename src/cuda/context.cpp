#include "cuda/context.hpp"

#include "cuda/driver.hpp"

namespace flashjit::detail {

PrimaryContext::PrimaryContext(int ordinal) {
  const DriverApi& cu = driver();
  check(cu.cuDeviceGet(&device_, ordinal), "cuDeviceGet");
  check(cu.cuDevicePrimaryCtxRetain(&context_, device_), "cuDevicePrimaryCtxRetain");
}

PrimaryContext::~PrimaryContext() { driver().cuDevicePrimaryCtxRelease(device_); }

namespace {

CUcontext current_context() {
  CUcontext current = nullptr;
  check(driver().cuCtxGetCurrent(&current), "cuCtxGetCurrent");
  return current;
}

// Pushes `context` unless it is `current`; true when it pushed (the scope must pop).
bool push_unless_current(CUcontext context, CUcontext current) {
  if (context == current) return false;
  check(driver().cuCtxPushCurrent(context), "cuCtxPushCurrent");
  return true;
}

void pop_if(bool pushed) {
  CUcontext popped = nullptr;
  if (pushed) driver().cuCtxPopCurrent(&popped);
}

}  // namespace

ScopedContext::ScopedContext(CUcontext context)
    : pushed_(push_unless_current(context, current_context())) {}

ScopedContext::~ScopedContext() { pop_if(pushed_); }

LaunchContext::LaunchContext(CUstream stream, CUcontext fallback) {
  const CUcontext current = current_context();
  if (stream != nullptr)
    check(driver().cuStreamGetCtx(stream, &context_), "cuStreamGetCtx");
  else
    context_ = current;
  if (context_ == nullptr) context_ = fallback;
  pushed_ = push_unless_current(context_, current);
}

LaunchContext::~LaunchContext() { pop_if(pushed_); }

}  // namespace flashjit::detail

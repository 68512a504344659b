// CUDA contexts: the device's primary context that an engine retains, and a scope that makes a
// context current on the calling thread.
#pragma once

#include <cuda.h>

namespace flashjit::detail {

// The device's primary context (the one the CUDA runtime uses), retained for the owner's lifetime.
class PrimaryContext {
 public:
  explicit PrimaryContext(int ordinal);
  ~PrimaryContext();
  PrimaryContext(const PrimaryContext&) = delete;
  PrimaryContext& operator=(const PrimaryContext&) = delete;

  CUdevice device() const { return device_; }
  CUcontext get() const { return context_; }

 private:
  CUdevice device_ = 0;
  CUcontext context_ = nullptr;
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

// The context a launch on `stream` runs in: the stream's; for the legacy default stream the
// current one, else `fallback` (the engine's primary context). Current for the scope.
class LaunchContext {
 public:
  LaunchContext(CUstream stream, CUcontext fallback);
  ~LaunchContext();
  LaunchContext(const LaunchContext&) = delete;
  LaunchContext& operator=(const LaunchContext&) = delete;

  CUcontext get() const { return context_; }

 private:
  CUcontext context_ = nullptr;
  bool pushed_ = false;
};

}  // namespace flashjit::detail

#include "api/workspaces.hpp"

#include <fmt/format.h>

#include <algorithm>

#include "core/log.hpp"
#include "cuda/context.hpp"
#include "cuda/driver.hpp"
#include "flashjit/flashjit.hpp"

namespace flashjit::detail {

void* Workspaces::get(CUcontext context, CUstream stream, std::size_t bytes) {
  std::lock_guard lock(mutex_);
  Buffer& buffer = buffers_[{context, stream}];
  if (buffer.bytes >= bytes) return reinterpret_cast<void*>(buffer.address);
  return grow(buffer, context, stream, bytes);
}

void* Workspaces::get_stream_ordered(CUcontext context, CUstream stream, std::size_t bytes) {
  if (stream == CU_STREAM_PER_THREAD) return nullptr;
  CUstreamCaptureStatus capture = CU_STREAM_CAPTURE_STATUS_NONE;
  check(driver().cuStreamIsCapturing(stream, &capture), "cuStreamIsCapturing");
  if (capture != CU_STREAM_CAPTURE_STATUS_NONE) return nullptr;
  std::lock_guard lock(mutex_);
  Buffer& buffer = buffers_[{context, stream}];
  if (buffer.bytes >= bytes) return reinterpret_cast<void*>(buffer.address);
  void* address = grow(buffer, context, stream, bytes);
  check(driver().cuMemsetD8Async(buffer.address, 0, buffer.bytes, stream), "cuMemsetD8Async");
  return address;
}

void* Workspaces::grow(Buffer& buffer, CUcontext context, CUstream stream, std::size_t bytes) {
  // Doubling bounds the number of growths (and of retired buffers) by log2 of the largest need.
  const std::size_t size = std::max(bytes, 2 * buffer.bytes);
  log().debug("{} for stream {}: {} bytes", what_, static_cast<void*>(stream), size);
  CUdeviceptr address = 0;
  check(driver().cuMemAlloc(&address, size), fmt::format("cuMemAlloc ({})", what_).c_str());
  if (buffer.address != 0) retired_.push_back(buffer);
  buffer = {context, address, size};
  return reinterpret_cast<void*>(address);
}

Workspaces::~Workspaces() {
  // Nothing may leave a destructor: ScopedContext throws when a context cannot be made current
  // (one already destroyed), which leaves nothing to wait for or free there.
  auto in_context = [](CUcontext context, auto&& call) {
    try {
      ScopedContext current(context);
      call();
    } catch (const Error&) {
    }
  };
  // cuMemFree only "may" synchronize (CUDA's driver API reference): launches still in flight on
  // these buffers finish first, one synchronization per context used. Teardown only.
  std::vector<CUcontext> contexts;
  for (const auto& [key, buffer] : buffers_)
    if (std::find(contexts.begin(), contexts.end(), buffer.context) == contexts.end())
      contexts.push_back(buffer.context);
  for (CUcontext context : contexts) in_context(context, [] { driver().cuCtxSynchronize(); });
  auto release = [&](const Buffer& buffer) {
    if (buffer.address != 0)
      in_context(buffer.context, [&] { driver().cuMemFree(buffer.address); });
  };
  for (const auto& [key, buffer] : buffers_) release(buffer);
  for (const Buffer& buffer : retired_) release(buffer);
}

}  // namespace flashjit::detail

#include "api/workspaces.hpp"

#include <algorithm>

#include "core/log.hpp"
#include "cuda/context.hpp"
#include "cuda/driver.hpp"

namespace flashjit::detail {

void* Workspaces::get(CUcontext context, CUstream stream, std::size_t bytes) {
  std::lock_guard lock(mutex_);
  Buffer& buffer = buffers_[{context, stream}];
  if (buffer.bytes >= bytes) return reinterpret_cast<void*>(buffer.address);
  // Doubling bounds the number of growths (and of retired buffers) by log2 of the largest need.
  const std::size_t size = std::max(bytes, 2 * buffer.bytes);
  CUdeviceptr address = 0;
  check(driver().cuMemAlloc(&address, size), "cuMemAlloc (split-KV workspace)");
  log().debug("split-KV workspace for stream {}: {} bytes", static_cast<void*>(stream), size);
  if (buffer.address != 0) retired_.push_back(buffer);
  buffer = {context, address, size};
  return reinterpret_cast<void*>(address);
}

Workspaces::~Workspaces() {
  auto release = [](const Buffer& buffer) {
    if (buffer.address == 0) return;
    ScopedContext current(buffer.context);
    driver().cuMemFree(buffer.address);
  };
  for (const auto& [key, buffer] : buffers_) release(buffer);
  for (const Buffer& buffer : retired_) release(buffer);
}

}  // namespace flashjit::detail

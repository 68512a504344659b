#include "flashjit/device_memory.hpp"

#include <fmt/format.h>

#include <utility>

#include "cuda/context.hpp"
#include "cuda/driver.hpp"

namespace flashjit {
namespace {

void check_range(std::size_t bytes, std::size_t offset, std::size_t size, const char* what) {
  if (offset > size || bytes > size - offset)
    throw Error(ErrorCode::invalid_argument,
                fmt::format("{} of {} bytes at offset {} overruns a {}-byte buffer", what, bytes,
                            offset, size));
}

}  // namespace

DeviceBuffer::DeviceBuffer(const Engine& engine, std::size_t bytes)
    : context_(engine.context()), bytes_(bytes) {
  detail::ScopedContext scope(context_);
  CUdeviceptr ptr = 0;
  detail::check(detail::driver().cuMemAlloc(&ptr, bytes == 0 ? 1 : bytes), "cuMemAlloc");
  data_ = reinterpret_cast<void*>(ptr);
}

DeviceBuffer::~DeviceBuffer() {
  if (data_ == nullptr) return;
  try {
    detail::ScopedContext scope(context_);
    detail::driver().cuMemFree(reinterpret_cast<CUdeviceptr>(data_));
  } catch (...) {
    // The context is gone (process teardown); so is the memory.
  }
}

DeviceBuffer::DeviceBuffer(DeviceBuffer&& other) noexcept
    : context_(other.context_),
      data_(std::exchange(other.data_, nullptr)),
      bytes_(std::exchange(other.bytes_, 0)) {}

DeviceBuffer& DeviceBuffer::operator=(DeviceBuffer&& other) noexcept {
  std::swap(context_, other.context_);
  std::swap(data_, other.data_);
  std::swap(bytes_, other.bytes_);
  return *this;
}

void DeviceBuffer::upload(const void* host, std::size_t bytes, std::size_t offset) {
  check_range(bytes, offset, bytes_, "upload");
  detail::ScopedContext scope(context_);
  detail::check(
      detail::driver().cuMemcpyHtoD(reinterpret_cast<CUdeviceptr>(data_) + offset, host, bytes),
      "cuMemcpyHtoD");
}

void DeviceBuffer::download(void* host, std::size_t bytes, std::size_t offset) const {
  check_range(bytes, offset, bytes_, "download");
  detail::ScopedContext scope(context_);
  detail::check(
      detail::driver().cuMemcpyDtoH(host, reinterpret_cast<CUdeviceptr>(data_) + offset, bytes),
      "cuMemcpyDtoH");
}

void DeviceBuffer::fill_bytes(unsigned char value) {
  detail::ScopedContext scope(context_);
  detail::check(detail::driver().cuMemsetD8(reinterpret_cast<CUdeviceptr>(data_), value, bytes_),
                "cuMemsetD8");
  detail::check(detail::driver().cuCtxSynchronize(), "cuCtxSynchronize");
}

EventTimer::EventTimer(const Engine& engine) : context_(engine.context()) {
  detail::ScopedContext scope(context_);
  detail::check(detail::driver().cuEventCreate(&begin_, CU_EVENT_DEFAULT), "cuEventCreate");
  detail::check(detail::driver().cuEventCreate(&end_, CU_EVENT_DEFAULT), "cuEventCreate");
}

EventTimer::~EventTimer() {
  try {
    detail::ScopedContext scope(context_);
    detail::driver().cuEventDestroy(begin_);
    detail::driver().cuEventDestroy(end_);
  } catch (...) {
  }
}

void EventTimer::start(CUstream_st* stream) {
  detail::ScopedContext scope(context_);
  detail::check(detail::driver().cuEventRecord(begin_, stream), "cuEventRecord");
}

float EventTimer::stop(CUstream_st* stream) {
  detail::ScopedContext scope(context_);
  const auto& cu = detail::driver();
  detail::check(cu.cuEventRecord(end_, stream), "cuEventRecord");
  detail::check(cu.cuEventSynchronize(end_), "cuEventSynchronize");
  float ms = 0;
  detail::check(cu.cuEventElapsedTime(&ms, begin_, end_), "cuEventElapsedTime");
  return ms;
}

Stream::Stream(const Engine& engine) : context_(engine.context()) {
  detail::ScopedContext scope(context_);
  detail::check(detail::driver().cuStreamCreate(&stream_, CU_STREAM_NON_BLOCKING),
                "cuStreamCreate");
}

Stream::~Stream() {
  detail::ScopedContext scope(context_);
  detail::driver().cuStreamDestroy(stream_);
}

void Stream::synchronize() const {
  detail::ScopedContext scope(context_);
  detail::check(detail::driver().cuStreamSynchronize(stream_), "cuStreamSynchronize");
}

void synchronize(const Engine& engine) {
  detail::ScopedContext scope(engine.context());
  detail::check(detail::driver().cuCtxSynchronize(), "cuCtxSynchronize");
}

DeviceMemoryInfo device_memory_info(const Engine& engine) {
  detail::ScopedContext scope(engine.context());
  DeviceMemoryInfo info;
  detail::check(detail::driver().cuMemGetInfo(&info.free_bytes, &info.total_bytes), "cuMemGetInfo");
  return info;
}

}  // namespace flashjit

// Device memory and event timing on an Engine's GPU, for programs that have no CUDA runtime of
// their own (the flashjit CLI, tests, FFI users). Operations run in the engine's primary context.
#pragma once

#include <cstddef>

#include "flashjit/flashjit.hpp"

namespace flashjit {

class FLASHJIT_API DeviceBuffer {
 public:
  // Throws Error(cuda_error) when the allocation fails.
  DeviceBuffer(const Engine& engine, std::size_t bytes);
  ~DeviceBuffer();
  DeviceBuffer(DeviceBuffer&& other) noexcept;
  DeviceBuffer& operator=(DeviceBuffer&& other) noexcept;
  DeviceBuffer(const DeviceBuffer&) = delete;
  DeviceBuffer& operator=(const DeviceBuffer&) = delete;

  void* data() const { return data_; }
  std::size_t size() const { return bytes_; }
  // Synchronous copies; bytes + offset must fit the buffer (else Error(invalid_argument)).
  void upload(const void* host, std::size_t bytes, std::size_t offset = 0);
  void download(void* host, std::size_t bytes, std::size_t offset = 0) const;
  void fill_bytes(unsigned char value);

 private:
  CUctx_st* context_ = nullptr;
  void* data_ = nullptr;
  std::size_t bytes_ = 0;
};

// Device time between start() and stop() on one stream, from CUDA events.
class FLASHJIT_API EventTimer {
 public:
  explicit EventTimer(const Engine& engine);
  ~EventTimer();
  EventTimer(const EventTimer&) = delete;
  EventTimer& operator=(const EventTimer&) = delete;

  void start(CUstream_st* stream = nullptr);
  // Records the stop event, waits for it, and returns the milliseconds since start().
  float stop(CUstream_st* stream = nullptr);

 private:
  CUctx_st* context_ = nullptr;
  CUevent_st* begin_ = nullptr;
  CUevent_st* end_ = nullptr;
};

// A non-blocking stream of the engine's primary context (for timing and concurrency tests).
class FLASHJIT_API Stream {
 public:
  explicit Stream(const Engine& engine);
  ~Stream();
  Stream(const Stream&) = delete;
  Stream& operator=(const Stream&) = delete;

  CUstream_st* get() const { return stream_; }
  void synchronize() const;

 private:
  CUctx_st* context_ = nullptr;
  CUstream_st* stream_ = nullptr;
};

// Waits for all work on the engine's device (its primary context).
FLASHJIT_API void synchronize(const Engine& engine);

struct DeviceMemoryInfo {
  std::size_t free_bytes = 0, total_bytes = 0;
};
// Free and total memory of the engine's device, as the driver reports them.
FLASHJIT_API DeviceMemoryInfo device_memory_info(const Engine& engine);

}  // namespace flashjit

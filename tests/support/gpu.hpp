// GPU test helpers: whether a GPU is here, and device buffers through flashjit's driver table.
#pragma once

#include <cuda.h>

#include <cstddef>
#include <cstdint>
#include <string>
#include <vector>

namespace flashjit::test {

// Empty when a GPU is usable, else why not (printed as the visible skip reason).
std::string gpu_unavailable_reason();

// Device memory in the primary context of device 0, made current on construction.
class DeviceBuffer {
 public:
  explicit DeviceBuffer(std::size_t bytes);
  ~DeviceBuffer();
  DeviceBuffer(const DeviceBuffer&) = delete;
  DeviceBuffer& operator=(const DeviceBuffer&) = delete;

  void* get() const { return reinterpret_cast<void*>(ptr_); }
  std::size_t bytes() const { return bytes_; }
  void upload(const void* host, std::size_t bytes);
  void download(void* host, std::size_t bytes) const;
  void fill_bytes(unsigned char value);

  template <typename T>
  std::vector<T> download_all() const {
    std::vector<T> host(bytes_ / sizeof(T));
    download(host.data(), host.size() * sizeof(T));
    return host;
  }

 private:
  CUdeviceptr ptr_ = 0;
  std::size_t bytes_ = 0;
};

// Makes device 0's primary context current on this thread (idempotent).
void use_primary_context();
void synchronize();

}  // namespace flashjit::test

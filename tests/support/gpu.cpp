#include "gpu.hpp"

#include "driver.hpp"
#include "flashjit/flashjit.hpp"

namespace flashjit::test {

std::string gpu_unavailable_reason() {
  try {
    if (flashjit::devices().empty()) return "no CUDA device";
    return {};
  } catch (const flashjit::Error& e) {
    return e.what();
  }
}

void use_primary_context() {
  const auto& cu = detail::driver();
  static CUcontext context = [&] {
    CUdevice device = 0;
    CUcontext made = nullptr;
    detail::check(cu.cuDeviceGet(&device, 0), "cuDeviceGet");
    detail::check(cu.cuDevicePrimaryCtxRetain(&made, device), "cuDevicePrimaryCtxRetain");
    return made;
  }();
  CUcontext current = nullptr;
  detail::check(cu.cuCtxGetCurrent(&current), "cuCtxGetCurrent");
  if (current != context) detail::check(cu.cuCtxPushCurrent(context), "cuCtxPushCurrent");
}

void synchronize() { detail::check(detail::driver().cuCtxSynchronize(), "cuCtxSynchronize"); }

DeviceBuffer::DeviceBuffer(std::size_t bytes) : bytes_(bytes) {
  use_primary_context();
  detail::check(detail::driver().cuMemAlloc(&ptr_, bytes == 0 ? 16 : bytes), "cuMemAlloc");
}

DeviceBuffer::~DeviceBuffer() {
  if (ptr_ != 0) detail::driver().cuMemFree(ptr_);
}

void DeviceBuffer::upload(const void* host, std::size_t bytes) {
  detail::check(detail::driver().cuMemcpyHtoD(ptr_, host, bytes), "cuMemcpyHtoD");
}

void DeviceBuffer::download(void* host, std::size_t bytes) const {
  detail::check(detail::driver().cuMemcpyDtoH(host, ptr_, bytes), "cuMemcpyDtoH");
}

void DeviceBuffer::fill_bytes(unsigned char value) {
  detail::check(detail::driver().cuMemsetD8(ptr_, value, bytes_), "cuMemsetD8");
}

}  // namespace flashjit::test

#include "cuda/device.hpp"

#include <fmt/format.h>

#include "core/arch.hpp"
#include "cuda/driver.hpp"

namespace flashjit::detail {

DeviceInfo query_device(int ordinal) {
  const DriverApi& cu = driver();
  int count = 0;
  check(cu.cuDeviceGetCount(&count), "cuDeviceGetCount");
  if (count == 0) throw Error(ErrorCode::no_device, "no CUDA device");
  if (ordinal < 0 || ordinal >= count)
    throw Error(ErrorCode::invalid_argument,
                fmt::format("device {} does not exist: expected 0..{}", ordinal, count - 1));
  CUdevice device = 0;
  check(cu.cuDeviceGet(&device, ordinal), "cuDeviceGet");
  auto attribute = [&](CUdevice_attribute which) {
    int value = 0;
    check(cu.cuDeviceGetAttribute(&value, which, device), "cuDeviceGetAttribute");
    return value;
  };
  DeviceInfo info;
  info.ordinal = ordinal;
  char name[256] = {};
  check(cu.cuDeviceGetName(name, sizeof(name), device), "cuDeviceGetName");
  info.name = name;
  info.cc_major = attribute(CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MAJOR);
  info.cc_minor = attribute(CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MINOR);
  info.multiprocessors = attribute(CU_DEVICE_ATTRIBUTE_MULTIPROCESSOR_COUNT);
  info.max_shared_per_block_optin =
      attribute(CU_DEVICE_ATTRIBUTE_MAX_SHARED_MEMORY_PER_BLOCK_OPTIN);
  info.l2_cache_bytes = static_cast<std::size_t>(attribute(CU_DEVICE_ATTRIBUTE_L2_CACHE_SIZE));
  check(cu.cuDeviceTotalMem(&info.total_memory, device), "cuDeviceTotalMem");
  info.arch = arch_for_compute_capability(info.cc_major, info.cc_minor);
  return info;
}

}  // namespace flashjit::detail

namespace flashjit {

std::vector<DeviceInfo> devices() {
  const auto& cu = detail::driver();
  int count = 0;
  detail::check(cu.cuDeviceGetCount(&count), "cuDeviceGetCount");
  std::vector<DeviceInfo> found;
  for (int i = 0; i < count; ++i) found.push_back(detail::query_device(i));
  return found;
}

int driver_version() {
  int value = 0;
  detail::check(detail::driver().cuDriverGetVersion(&value), "cuDriverGetVersion");
  return value;
}

}  // namespace flashjit

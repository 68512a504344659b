// What a GPU is: name, compute capability, SMs, shared-memory limit, L2 size -> the arch we compile
// for.
#pragma once

#include "flashjit/flashjit.hpp"

namespace flashjit::detail {
// Throws Error(no_driver / no_device / invalid_argument for a bad ordinal).
DeviceInfo query_device(int ordinal);
}  // namespace flashjit::detail

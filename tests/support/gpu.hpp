// Whether this machine has a usable GPU, and the one Engine the GPU tests share.
#pragma once

#include <string>
#include <vector>

#include "flashjit/device_memory.hpp"
#include "flashjit/flashjit.hpp"

namespace flashjit::test {
// Empty when a GPU is usable, else why not (printed as the visible skip reason).
std::string gpu_unavailable_reason();
Engine& shared_engine();
// The library's kernel families by name, fastest first (every GPU test covers each).
std::vector<std::string> family_names();
// The backward's dK/dV families that run on the shared engine's GPU (BackwardOptions::family
// takes them), fastest first: those with FamilyInfo::backward, less the passes around them
// (bwd_prep, bwd_convert) and the deterministic dQ kernels (names ending in _dq).
std::vector<std::string> backward_family_names();
// Whether the family (by name) has kernels for this head dim (FamilyInfo::head_dims).
bool family_has_head_dim(const std::string& family, int head_dim);
// A device copy of `values` on the engine's GPU (per-head inputs, user functions' args).
template <typename T>
DeviceBuffer device_copy(const Engine& engine, const std::vector<T>& values) {
  DeviceBuffer buffer(engine, values.size() * sizeof(T));
  buffer.upload(values.data(), values.size() * sizeof(T));
  return buffer;
}
}  // namespace flashjit::test

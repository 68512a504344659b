// Whether this machine has a usable GPU, and the one Engine the GPU tests share.
#pragma once

#include <string>
#include <vector>

#include "flashjit/flashjit.hpp"

namespace flashjit::test {
// Empty when a GPU is usable, else why not (printed as the visible skip reason).
std::string gpu_unavailable_reason();
Engine& shared_engine();
// The library's kernel families by name, fastest first (every GPU test covers each).
std::vector<std::string> family_names();
}  // namespace flashjit::test

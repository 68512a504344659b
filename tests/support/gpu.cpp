#include "gpu.hpp"

namespace flashjit::test {

std::string gpu_unavailable_reason() {
  try {
    if (flashjit::devices().empty()) return "no CUDA device";
    return {};
  } catch (const flashjit::Error& e) {
    return e.what();
  }
}

Engine& shared_engine() {
  static Engine engine(0);
  return engine;
}

}  // namespace flashjit::test

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

std::vector<std::string> family_names() {
  std::vector<std::string> names;
  for (const FamilyInfo& family : families())
    if (family.attention) names.push_back(family.name);
  return names;
}

Engine& shared_engine() {
  static Engine engine(0);
  return engine;
}

}  // namespace flashjit::test

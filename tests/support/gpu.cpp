#include "gpu.hpp"

#include <algorithm>

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

std::vector<std::string> backward_family_names() {
  const std::string& arch = shared_engine().device().arch;
  std::vector<std::string> names;
  for (const FamilyInfo& family : families()) {
    const std::string& name = family.name;
    const bool helper = name == "bwd_prep" || name == "bwd_convert" || name == "bwd_sink" ||
                        name.ends_with("_dq");
    const bool runs_here =
        std::find(family.archs.begin(), family.archs.end(), arch) != family.archs.end();
    if (family.backward && !helper && runs_here) names.push_back(name);
  }
  return names;
}

bool family_has_head_dim(const std::string& family, int head_dim) {
  for (const FamilyInfo& info : families())
    if (info.name == family)
      return std::find(info.head_dims.begin(), info.head_dims.end(), head_dim) !=
             info.head_dims.end();
  return false;
}

Engine& shared_engine() {
  static Engine engine(0);
  return engine;
}

}  // namespace flashjit::test

// Compile-time flags for generic lambdas (no <type_traits> in NVRTC without the toolkit): a step
// written once as [&](auto masked) { ... decltype(masked)::value ... } and called with True{} or
// False{} is compiled twice, each copy without the other's branches.
#pragma once

namespace flashjit {

struct True {
  static constexpr bool value = true;
};
struct False {
  static constexpr bool value = false;
};

}  // namespace flashjit

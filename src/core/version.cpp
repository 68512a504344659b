#include "flashjit/flashjit.hpp"

namespace flashjit {
std::string_view version() { return FLASHJIT_VERSION; }
}  // namespace flashjit

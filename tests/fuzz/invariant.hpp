// A fuzz harness's property check: on violation print what broke and abort, which libFuzzer
// reports as a crash (and saves the input) and the ctest replay reports as a failed test.
#pragma once

#include <cstdio>
#include <cstdlib>
#include <string>

namespace flashjit::fuzz {

inline void invariant(bool holds, const std::string& what) {
  if (holds) return;
  std::fprintf(stderr, "invariant violated: %s\n", what.c_str());
  std::abort();
}

}  // namespace flashjit::fuzz

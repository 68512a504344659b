// GPU suite entry: exits 77 (ctest: Skipped) with the reason when no GPU is usable.
#define DOCTEST_CONFIG_IMPLEMENT
#include <doctest/doctest.h>

#include <cstdio>

#include "gpu.hpp"

int main(int argc, char** argv) {
  if (const std::string why = flashjit::test::gpu_unavailable_reason(); !why.empty()) {
    std::printf("SKIPPED: GPU tests not run: %s\n", why.c_str());
    return 77;
  }
  doctest::Context context(argc, argv);
  return context.run();
}

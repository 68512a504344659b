// NVRTC compiles every default variant of every family, with no GPU, for each arch we ship.
#include <doctest/doctest.h>
#include <fmt/format.h>

#include <fstream>
#include <iterator>
#include <string>

#include "flashjit/flashjit.hpp"
#include "temp_dir.hpp"

using namespace flashjit;

TEST_CASE("every default variant of every family compiles for its archs") {
  test::TempDir dir;
  KernelCache cache(CacheOptions{dir.path()});
  for (const char* arch : {"sm_80", "sm_86", "sm_89", "sm_90", "sm_90a", "sm_120"}) {
    const auto variants = default_variants(arch);
    REQUIRE(!variants.empty());
    int spilling = 0;
    for (const CompileOutcome& outcome : cache.precompile(variants)) {
      INFO(outcome.variant.name(), ": ", outcome.error);
      CHECK(outcome.ok);
      REQUIRE(outcome.entry.has_value());
      CHECK(outcome.entry->cubin_bytes > 0);
      CHECK(outcome.entry->registers > 0);
      spilling += outcome.entry->spill_bytes > 0;
      // The backward kernels hold dK and dV in registers across their whole loop: none spills.
      if (outcome.variant.family.rfind("bwd_", 0) == 0) CHECK(outcome.entry->spill_bytes == 0);
    }
    MESSAGE(fmt::format("{}: {} variants compiled, {} with spills", arch, variants.size(), spilling));
  }
}

TEST_CASE("a broken kernel source fails with the NVRTC log and caches nothing") {
  test::TempDir sources, cache_dir;
  std::filesystem::copy(FLASHJIT_SOURCE_DIR "/kernels_src", sources.path(),
                        std::filesystem::copy_options::recursive);
  {
    std::ofstream broken(sources.path() / "simt/kernel.cu", std::ios::app);
    broken << "\nthis is not C++;\n";
  }
  ::setenv("FLASHJIT_KERNELS_DIR", sources.path().c_str(), 1);
  KernelCache cache(CacheOptions{cache_dir.path()});
  const auto outcome = cache.compile(Variant::parse("simt.sm80.bf16.d64.m64n64s1"));
  ::unsetenv("FLASHJIT_KERNELS_DIR");
  CHECK_FALSE(outcome.ok);
  CHECK(outcome.error.find("NVRTC could not compile") != std::string::npos);
  CHECK(outcome.error.find("simt/kernel.cu") != std::string::npos);
  CHECK(cache.list().empty());
}

TEST_CASE("a kernel whose layout drifts from its shape.cuh does not compile") {
  // The kernel static_asserts its barrier block against WgmmaShape's bytes, which the host's
  // shared-memory size also comes from: one more barrier in the kernel alone must fail.
  test::TempDir sources, cache_dir;
  std::filesystem::copy(FLASHJIT_SOURCE_DIR "/kernels_src", sources.path(),
                        std::filesystem::copy_options::recursive);
  const auto kernel = sources.path() / "wgmma/kernel.cu";
  std::string text;
  {
    std::ifstream in(kernel);
    text.assign(std::istreambuf_iterator<char>(in), {});
  }
  const std::string barriers = "unsigned long long q_full, q_empty;";
  REQUIRE(text.find(barriers) != std::string::npos);
  text.replace(text.find(barriers), barriers.size(), "unsigned long long q_full, q_empty, extra;");
  std::ofstream(kernel) << text;
  ::setenv("FLASHJIT_KERNELS_DIR", sources.path().c_str(), 1);
  KernelCache cache(CacheOptions{cache_dir.path()});
  const auto outcome = cache.compile(Variant::parse("wgmma.sm90a.bf16.d64.m128n128s2"));
  ::unsetenv("FLASHJIT_KERNELS_DIR");
  CHECK_FALSE(outcome.ok);
  CHECK(outcome.error.find("barrier bytes") != std::string::npos);
}

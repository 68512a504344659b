// NVRTC compiles every default variant of every family, with no GPU, for each arch we ship.
#include <doctest/doctest.h>
#include <fmt/format.h>
#include <nlohmann/json.hpp>
#include <spdlog/sinks/ostream_sink.h>

#include <algorithm>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <memory>
#include <sstream>
#include <string>

#include "core/log.hpp"
#include "flashjit/flashjit.hpp"
#include "jit/nvrtc.hpp"
#include "temp_dir.hpp"

using namespace flashjit;

namespace {

// The library's warnings while this lives; its sink leaves the logger again even when a REQUIRE
// throws (the logger outlives the test and would write into a destroyed stream).
struct CapturedWarnings {
  std::ostringstream text;
  std::shared_ptr<spdlog::sinks::ostream_sink_mt> sink =
      std::make_shared<spdlog::sinks::ostream_sink_mt>(text);

  CapturedWarnings() {
    sink->set_level(spdlog::level::warn);
    detail::log().sinks().push_back(sink);
  }
  ~CapturedWarnings() {
    auto& sinks = detail::log().sinks();
    sinks.erase(std::remove(sinks.begin(), sinks.end(), sink), sinks.end());
  }
  CapturedWarnings(const CapturedWarnings&) = delete;
  CapturedWarnings& operator=(const CapturedWarnings&) = delete;
};

}  // namespace

TEST_CASE("every default variant of every family compiles for its archs") {
  test::TempDir dir;
  KernelCache cache(CacheOptions{dir.path()});
  // None of the warnings may say ptxas serialized a kernel's wgmma (such a kernel compiles and
  // passes every test, at a fraction of its speed).
  const CapturedWarnings warnings;
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
  CHECK_MESSAGE(warnings.text.str().find("serialized its wgmma") == std::string::npos,
                warnings.text.str());
  // Nor may NVRTC warn about our sources (each entry's metadata keeps the log): users read the
  // log at debug level, and a warning there reads as a defect of the kernel.
  int entries = 0;
  for (const auto& item : std::filesystem::recursive_directory_iterator(dir.path())) {
    if (item.path().extension() != ".json") continue;
    ++entries;
    std::ifstream file(item.path());
    const std::string log = nlohmann::json::parse(file).value("log", "");
    CHECK_MESSAGE(log.find("warning #") == std::string::npos, item.path().filename().string(),
                  ": ", log);
  }
  CHECK(entries > 0);
}

TEST_CASE("the dK/dV kernels compile without spills with every mix of score variants") {
  // Each default dK/dV variant with softcap, window and ALiBi in each combination: bwd_wgmma's
  // sm_90a ones (320) test masked blocks' rows against a key's range of rows (rows_seeing), which
  // took 16 of them from 8-188 B of spills to none (docs/perf-log.md, sessions 42-43); bwd_mma's
  // on sm_80 and sm_90a, the archs where it spilled (sm_86 / sm_89 have smaller tiles), take a
  // tile's query rows in two parts where one part spilled, which took 58 of 1536 from 8-52 B to
  // none (session 44). bf16 only for bwd_mma: fp16 spilled exactly where bf16 did.
  test::TempDir dir;
  KernelCache cache(CacheOptions{dir.path()});
  const std::pair<const char*, const char*> targets[] = {{"bwd_wgmma", "sm_90a"},
                                                         {"bwd_wgmma_fused", "sm_90a"},
                                                         {"bwd_mma", "sm_80"},
                                                         {"bwd_mma", "sm_90a"}};
  std::vector<Variant> variants;
  for (const auto& [family, arch] : targets) {
    const size_t before = variants.size();
    for (const Variant& plain : default_variants(arch)) {
      if (plain.family != family) continue;
      if (plain.family == "bwd_mma" && plain.dtype != DType::bf16) continue;
      for (int mix = 0; mix < 8; ++mix) {
        Variant v = plain;
        v.softcap = mix & 1;
        v.window = mix & 2;
        v.alibi = mix & 4;
        variants.push_back(v);
      }
    }
    CHECK_MESSAGE(variants.size() - before >= 8, family, " has no default ", arch, " variant");
  }
  for (const CompileOutcome& outcome : cache.precompile(variants)) {
    INFO(outcome.variant.name(), ": ", outcome.error);
    CHECK(outcome.ok);
    REQUIRE(outcome.entry.has_value());
    CHECK(outcome.entry->spill_bytes == 0);
  }
  MESSAGE(fmt::format("{} dK/dV variants with score variants compiled", variants.size()));
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

TEST_CASE("ptxas's notes that it serialized wgmma are found in an NVRTC log") {
  // The note as NVRTC 13.0 printed it (session 20), beside the usual resource lines.
  const std::string serialized =
      "ptxas info    : Compiling entry function '_ZN8flashjit16bwd_wgmma_kernel' for 'sm_90a'\n"
      "ptxas info    : (C7514) Potential Performance Loss: wgmma.mma_async instructions are "
      "serialized due to non wgmma instructions reading accumulator registers of  a wgmma between "
      "start and end of the pipeline stage in the function '_ZN8flashjit16bwd_wgmma_kernel'\n"
      "ptxas info    : Used 168 registers, 0 bytes spill stores, 0 bytes spill loads\n";
  const auto notes = detail::wgmma_serialization_notes(serialized);
  REQUIRE(notes.size() == 1);
  CHECK(notes[0].rfind("C7514: wgmma.mma_async instructions are serialized due to non wgmma", 0) ==
        0);
  CHECK(notes[0].find("pipeline stage") != std::string::npos);
  CHECK(notes[0].find("_ZN8flashjit") == std::string::npos);  // the reason, not the function
  CHECK(detail::wgmma_serialization_notes(
            "ptxas info    : Used 168 registers, 0 bytes spill stores, 0 bytes spill loads\n"
            "ptxas info    : (C7515) Potential Performance Loss: wgmma.mma_async instructions are "
            "serialized due to the presence of Extern calls")
            .size() == 1);
  const auto registers = detail::wgmma_serialization_notes(
      "ptxas info    : (C7512) Potential Performance Loss: wgmma.mma_async instructions are "
      "serialized due to insufficient register resources for the function '_ZN8flashjit1k'\n");
  REQUIRE(registers.size() == 1);
  CHECK(registers[0] == "C7512: wgmma.mma_async instructions are serialized due to insufficient "
                        "register resources");
  CHECK(detail::wgmma_serialization_notes(
            "ptxas info    : Used 168 registers, 0 bytes spill stores, 0 bytes spill loads\n")
            .empty());
}

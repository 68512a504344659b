// The disk cache: content keys, atomic publish across processes, corruption recovery, fallbacks.
#include <doctest/doctest.h>
#include <sys/wait.h>
#include <unistd.h>
#include <xxhash.h>

#include <fstream>
#include <nlohmann/json.hpp>
#include <set>
#include <sstream>
#include <thread>

#include "families/registry.hpp"
#include "flashjit/flashjit.hpp"
#include "jit/content_key.hpp"
#include "jit/kernel_store.hpp"
#include "temp_dir.hpp"

using namespace flashjit;
namespace fs = std::filesystem;

namespace {

const Variant kVariant = Variant::parse("simt.sm80.bf16.d64.m64n64s1");

// The content key the library computes for a variant now (sources as found at this moment).
std::string current_key(const Variant& variant) {
  const test::TempDir dir;
  return detail::KernelStore(CacheOptions{dir.path()})
      .key_for(variant, detail::kernel_spec(variant));
}

std::string read_all(const fs::path& path) {
  std::ifstream file(path, std::ios::binary);
  std::ostringstream text;
  text << file.rdbuf();
  return text.str();
}

// Every entry's metadata parses and its cubin matches the recorded size and hash; no temp files.
int count_valid_entries(const fs::path& dir) {
  int valid = 0;
  for (const auto& item : fs::directory_iterator(dir)) {
    const std::string name = item.path().filename().string();
    CHECK_MESSAGE(name.rfind(".tmp.", 0) != 0, "temp file left behind: " << name);
    if (item.path().extension() != ".json") continue;
    const auto doc = nlohmann::json::parse(read_all(item.path()));
    fs::path cubin = item.path();
    cubin.replace_extension(".cubin");
    const std::string bytes = read_all(cubin);
    CHECK(bytes.size() == doc.at("cubin_bytes").get<size_t>());
    char hash[17];
    std::snprintf(hash, sizeof hash, "%016llx",
                  static_cast<unsigned long long>(XXH3_64bits(bytes.data(), bytes.size())));
    CHECK(doc.at("cubin_xxh3").get<std::string>() == hash);
    ++valid;
  }
  return valid;
}

}  // namespace

TEST_CASE("the content key changes with source, options, variant and versions") {
  const detail::KeyInputs base{"0.1.0",
                               "13.0",
                               "simt.sm80.bf16.d64.m64n64s1",
                               "expr",
                               "",
                               {"--gpu-architecture=sm_80"},
                               {{"a.cu", "int x;"}, {"b.cuh", "y"}}};
  const std::string key = detail::content_key(base);
  CHECK(key.size() == 32);
  CHECK(detail::content_key(base) == key);
  auto changed = [&](auto mutate) {
    detail::KeyInputs inputs = base;
    mutate(inputs);
    return detail::content_key(inputs);
  };
  std::set<std::string> keys = {
      key,
      changed([](auto& i) { i.flashjit_version = "0.1.1"; }),
      changed([](auto& i) { i.nvrtc_version = "13.1"; }),
      changed([](auto& i) { i.variant_name = "simt.sm80.bf16.d64.m64n64s1.causal"; }),
      changed([](auto& i) { i.block_mask_name_expression = "expr, true"; }),
      changed([](auto& i) { i.options.push_back("-lineinfo"); }),
      changed([](auto& i) { i.sources[0].text = "int x; "; }),
      changed([](auto& i) { i.sources[1].text = "z"; }),  // an included header
      changed([](auto& i) { i.sources[1].path = "c.cuh"; }),
      // Field boundaries matter: moving a character between fields is a different key.
      changed([](auto& i) { i.sources = {{"a.cu", "int x;b.cuh"}, {"", "y"}}; }),
  };
  CHECK(keys.size() == 10);
}

TEST_CASE("the real key follows the kernel sources (FLASHJIT_KERNELS_DIR)") {
  test::TempDir sources;
  fs::copy(FLASHJIT_SOURCE_DIR "/kernels_src", sources.path(), fs::copy_options::recursive);
  const std::string embedded = current_key(kVariant);
  ::setenv("FLASHJIT_KERNELS_DIR", sources.path().c_str(), 1);
  const std::string same_text = current_key(kVariant);
  {
    std::ofstream header(sources.path() / "common" / "masking.cuh", std::ios::app);
    header << "\n// an edit to an included header\n";
  }
  const std::string edited = current_key(kVariant);
  ::unsetenv("FLASHJIT_KERNELS_DIR");
  CHECK(same_text == embedded);
  CHECK(edited != embedded);
}

TEST_CASE("a second cache on the same directory serves the entry from disk") {
  test::TempDir dir;
  {
    KernelCache first(CacheOptions{dir.path()});
    const auto outcome = first.compile(kVariant);
    REQUIRE(outcome.ok);
    CHECK_FALSE(outcome.was_cached);
    CHECK(first.compile(kVariant).was_cached);  // memory
  }
  KernelCache second(CacheOptions{dir.path()});
  const auto outcome = second.compile(kVariant);
  CHECK(outcome.ok);
  CHECK(outcome.was_cached);  // disk
  const auto entries = second.list();
  REQUIRE(entries.size() == 1);
  CHECK(entries[0].variant == kVariant);
  CHECK(entries[0].registers > 0);
  CHECK(entries[0].nvrtc_version == nvrtc_version());
  CHECK(count_valid_entries(dir.path()) == 1);
}

TEST_CASE("several processes filling one cache directory leave only valid entries") {
  test::TempDir dir;
  const std::vector<Variant> variants = {
      Variant::parse("simt.sm80.bf16.d64.m64n64s1"), Variant::parse("simt.sm80.fp16.d64.m64n64s1"),
      Variant::parse("simt.sm86.bf16.d128.m64n64s1.causal"),
      Variant::parse("simt.sm90a.bf16.d32.m64n64s1")};
  constexpr int kProcesses = 6;
  std::vector<pid_t> children;
  for (int i = 0; i < kProcesses; ++i) {
    pid_t pid = fork();
    REQUIRE(pid >= 0);
    if (pid == 0) {
      KernelCache cache(CacheOptions{dir.path()});
      bool ok = true;
      for (const auto& outcome : cache.precompile(variants, 2)) ok = ok && outcome.ok;
      _exit(ok ? 0 : 1);
    }
    children.push_back(pid);
  }
  for (pid_t pid : children) {
    int status = 0;
    waitpid(pid, &status, 0);
    CHECK(WIFEXITED(status));
    CHECK(WEXITSTATUS(status) == 0);
  }
  CHECK(count_valid_entries(dir.path()) == static_cast<int>(variants.size()));
  KernelCache reader(CacheOptions{dir.path()});
  for (const auto& outcome : reader.precompile(variants)) CHECK(outcome.was_cached);
}

TEST_CASE("many threads asking for one variant compile it once") {
  test::TempDir dir;
  KernelCache cache(CacheOptions{dir.path()});
  std::vector<CompileOutcome> outcomes(16);
  std::vector<std::thread> threads;
  for (auto& outcome : outcomes) threads.emplace_back([&] { outcome = cache.compile(kVariant); });
  for (auto& t : threads) t.join();
  int compiled = 0;
  for (const auto& outcome : outcomes) {
    CHECK(outcome.ok);
    compiled += !outcome.was_cached;
  }
  CHECK(compiled == 1);
}

TEST_CASE("a corrupted entry is discarded and recompiled") {
  test::TempDir dir;
  fs::path cubin;
  {
    KernelCache cache(CacheOptions{dir.path()});
    const auto outcome = cache.compile(kVariant);
    REQUIRE(outcome.ok);
    cubin = outcome.entry->cubin_path;
  }
  SUBCASE("a flipped byte in the cubin") {
    std::fstream file(cubin, std::ios::in | std::ios::out | std::ios::binary);
    file.seekp(100);
    char byte = 0;
    file.read(&byte, 1);
    file.seekp(100);
    byte = static_cast<char>(byte ^ 0x5a);
    file.write(&byte, 1);
  }
  SUBCASE("a truncated cubin") { fs::resize_file(cubin, 64); }
  SUBCASE("torn metadata") {
    fs::path meta = cubin;
    meta.replace_extension(".json");
    fs::resize_file(meta, fs::file_size(meta) / 2);
  }
  SUBCASE("metadata with a number no int holds (found by tests/fuzz/fuzz_cache_metadata)") {
    fs::path meta = cubin;
    meta.replace_extension(".json");
    auto doc = nlohmann::json::parse(read_all(meta));
    doc["registers"] = 1e300;
    std::ofstream(meta, std::ios::trunc) << doc.dump();
  }
  KernelCache cache(CacheOptions{dir.path()});
  const auto outcome = cache.compile(kVariant);
  CHECK(outcome.ok);
  CHECK_FALSE(outcome.was_cached);  // the bad entry was not served
  CHECK(count_valid_entries(dir.path()) == 1);
  KernelCache again(CacheOptions{dir.path()});
  CHECK(again.compile(kVariant).was_cached);
}

TEST_CASE("an unusable cache directory degrades to memory only") {
  test::TempDir dir;
  const fs::path blocker = dir.path() / "not-a-directory";
  std::ofstream(blocker) << "a file where the cache directory would go";
  KernelCache cache(CacheOptions{blocker / "cache"});
  CHECK_FALSE(cache.directory().has_value());
  const auto outcome = cache.compile(kVariant);
  CHECK(outcome.ok);
  CHECK(cache.compile(kVariant).was_cached);  // memory still works
  CHECK(cache.list().empty());
}

TEST_CASE("the default directory follows FLASHJIT_CACHE_DIR, then XDG_CACHE_HOME, then HOME") {
  test::TempDir dir;
  const char* saved_home = std::getenv("HOME");
  const std::string home = saved_home ? saved_home : "";
  ::setenv("FLASHJIT_CACHE_DIR", (dir.path() / "explicit").c_str(), 1);
  ::setenv("XDG_CACHE_HOME", (dir.path() / "xdg").c_str(), 1);
  ::setenv("HOME", (dir.path() / "home").c_str(), 1);
  CHECK(KernelCache().directory() == dir.path() / "explicit");
  ::unsetenv("FLASHJIT_CACHE_DIR");
  CHECK(KernelCache().directory() == dir.path() / "xdg" / "flashjit");
  ::unsetenv("XDG_CACHE_HOME");
  CHECK(KernelCache().directory() == dir.path() / "home" / ".cache" / "flashjit");
  ::setenv("HOME", home.c_str(), 1);
}

TEST_CASE("clear and prune remove whole entries") {
  test::TempDir dir;
  KernelCache cache(CacheOptions{dir.path()});
  cache.precompile({Variant::parse("simt.sm80.bf16.d64.m64n64s1"),
                    Variant::parse("simt.sm86.bf16.d64.m64n64s1"),
                    Variant::parse("simt.sm90a.bf16.d64.m64n64s1")});
  REQUIRE(cache.list().size() == 3);
  CHECK(cache.clear(std::string("sm_86")) == 1);
  CHECK(cache.list().size() == 2);
  CHECK(cache.list(std::string("sm_86")).empty());
  CHECK(cache.prune(0) == 2);
  CHECK(cache.list().empty());
  CHECK(count_valid_entries(dir.path()) == 0);
}

TEST_CASE("entries from other kernel sources are listed as stale and removed by remove_stale") {
  test::TempDir dir, sources;
  fs::copy(FLASHJIT_SOURCE_DIR "/kernels_src", sources.path(), fs::copy_options::recursive);
  KernelCache(CacheOptions{dir.path()}).compile(kVariant);
  {
    std::ofstream header(sources.path() / "common" / "masking.cuh", std::ios::app);
    header << "\n// an edit to an included header\n";
  }
  ::setenv("FLASHJIT_KERNELS_DIR", sources.path().c_str(), 1);
  KernelCache edited(CacheOptions{dir.path()});
  CHECK_FALSE(edited.compile(kVariant).was_cached);  // the old binary is not served
  auto entries = edited.list();
  REQUIRE(entries.size() == 2);
  CHECK((entries[0].state == EntryState::current) != (entries[1].state == EntryState::current));
  CHECK(edited.remove_stale() == 1);
  entries = edited.list();
  ::unsetenv("FLASHJIT_KERNELS_DIR");
  REQUIRE(entries.size() == 1);
  CHECK(entries[0].state == EntryState::current);
  CHECK(KernelCache(CacheOptions{dir.path()}).list()[0].state == EntryState::stale);  // embedded
}

TEST_CASE("the log level is set by name; an unknown name is an error") {
  CHECK_NOTHROW(set_log_level("error"));
  CHECK_NOTHROW(set_log_level("off"));
  CHECK_THROWS_WITH_AS(set_log_level("loud"), doctest::Contains("log level 'loud' is unknown"),
                       Error);
  set_log_level("warn");
}

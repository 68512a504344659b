// The cache's trust model (docs/cache.md), tried as an attacker and as a demanding operator:
// planted, foreign, linked and hostile files, unusable or read-only directories, races.
#include <doctest/doctest.h>
#include <fcntl.h>
#include <fmt/format.h>
#include <sys/mount.h>
#include <sys/stat.h>
#include <unistd.h>

#include <atomic>
#include <chrono>
#include <cstdlib>
#include <fstream>
#include <future>
#include <limits>
#include <nlohmann/json.hpp>
#include <sstream>
#include <thread>

#include "cuda/driver.hpp"
#include "families/registry.hpp"
#include "flashjit/flashjit.h"
#include "flashjit/flashjit.hpp"
#include "jit/cache_location.hpp"
#include "jit/disk_cache.hpp"
#include "jit/kernel_store.hpp"
#include "temp_dir.hpp"

using namespace flashjit;
namespace fs = std::filesystem;

namespace {

const Variant kVariant = Variant::parse("simt.sm80.bf16.d32.m64n64s1");
const Variant kOther = Variant::parse("simt.sm80.fp16.d32.m64n64s1");

constexpr uid_t kStranger = 54321;  // a uid that is neither this user nor root

std::string read_all(const fs::path& path) {
  std::ifstream file(path, std::ios::binary);
  std::ostringstream text;
  text << file.rdbuf();
  return text.str();
}

void write_all(const fs::path& path, const std::string& bytes) {
  std::ofstream(path, std::ios::binary | std::ios::trunc) << bytes;
}

// The stem of the entry the cache would write for `variant` now.
fs::path entry_stem(const fs::path& dir, const Variant& variant) {
  const test::TempDir scratch;
  const std::string key = detail::KernelStore(CacheOptions{scratch.path()})
                              .key_for(variant, detail::kernel_spec(variant));
  return dir / fmt::format("{}.{}", variant.name(), key.substr(0, 16));
}

// One variant compiled into `dir`; the outcome.
CompileOutcome compile_into(const fs::path& dir, const Variant& variant = kVariant) {
  return KernelCache(CacheOptions{dir}).compile(variant);
}

bool is_root() { return ::geteuid() == 0; }

// Sets an environment variable for a scope, restoring it afterwards.
class ScopedEnv {
 public:
  ScopedEnv(const char* name, const char* value) : name_(name) {
    if (const char* old = std::getenv(name)) old_ = old;
    if (value)
      ::setenv(name, value, 1);
    else
      ::unsetenv(name);
  }
  ~ScopedEnv() {
    if (old_)
      ::setenv(name_, old_->c_str(), 1);
    else
      ::unsetenv(name_);
  }

 private:
  const char* name_;
  std::optional<std::string> old_;
};

}  // namespace

TEST_CASE("a cache directory writable by group or others is not used, and says why") {
  test::TempDir dir;
  ::chmod(dir.path().c_str(), 0777);
  KernelCache cache(CacheOptions{dir.path()});
  CHECK_FALSE(cache.directory().has_value());
  CHECK(cache.why_not_persistent().find("writable by group or others") != std::string::npos);
  CHECK(cache.why_not_persistent().find(dir.path().string()) != std::string::npos);
  const CompileOutcome outcome = cache.compile(kVariant);  // still works, in memory
  CHECK(outcome.ok);
  CHECK(fs::is_empty(dir.path()));
}

TEST_CASE("a cache directory or entry owned by another user is not trusted") {
  if (!is_root()) {
    MESSAGE("SKIPPED: foreign-owner tests need root (chown)");
    return;
  }
  SUBCASE("the directory") {
    test::TempDir dir;
    REQUIRE(::chown(dir.path().c_str(), kStranger, kStranger) == 0);
    KernelCache cache(CacheOptions{dir.path()});
    CHECK_FALSE(cache.directory().has_value());
    CHECK(cache.layers().empty());
    CHECK(cache.why_not_persistent().find("belongs to uid 54321") != std::string::npos);
  }
  SUBCASE("a planted cubin with matching metadata, of another owner") {
    test::TempDir dir;
    REQUIRE(compile_into(dir.path()).ok);
    const fs::path stem = entry_stem(dir.path(), kVariant);
    REQUIRE(::chown((stem.string() + ".cubin").c_str(), kStranger, kStranger) == 0);
    KernelCache cache(CacheOptions{dir.path()});
    const CompileOutcome outcome = cache.compile(kVariant);
    CHECK_FALSE(outcome.was_cached);  // not served: compiled again
    CHECK_FALSE(outcome.ok);          // and not adopted: the foreign cubin stays unvouched
    CHECK(outcome.error.find("refusing to adopt") != std::string::npos);
    CHECK(cache.list().empty());  // list shows no entry whose cubin is not trusted
  }
}

TEST_CASE("a planted cubin is served or adopted only if it is a cubin for the variant's arch") {
  test::TempDir dir;
  const fs::path stem = entry_stem(dir.path(), kVariant);
  SUBCASE("without metadata: the next writer refuses to adopt it") {
    write_all(stem.string() + ".cubin",
              "\x7f"
              "ELF but not really a cubin, planted");
    const CompileOutcome outcome = compile_into(dir.path());
    CHECK_FALSE(outcome.ok);
    CHECK(outcome.error.find("refusing to adopt") != std::string::npos);
    CHECK_FALSE(fs::exists(stem.string() + ".json"));  // no metadata vouches for it
  }
  SUBCASE("a real cubin of another arch, with metadata whose hash matches it") {
    test::TempDir elsewhere;
    const Variant sm90 = Variant::parse("simt.sm90.bf16.d32.m64n64s1");
    REQUIRE(compile_into(elsewhere.path(), sm90).ok);
    REQUIRE(compile_into(dir.path()).ok);
    const std::string foreign = read_all(entry_stem(elsewhere.path(), sm90).string() + ".cubin");
    auto meta = nlohmann::json::parse(read_all(stem.string() + ".json"));
    meta["cubin_bytes"] = foreign.size();
    meta["cubin_xxh3"] = detail::cubin_hash(foreign);
    write_all(stem.string() + ".json", meta.dump());
    write_all(stem.string() + ".cubin", foreign);
    const CompileOutcome outcome = compile_into(dir.path());
    CHECK_FALSE(outcome.was_cached);  // refused (SM 90 is not sm_80), discarded, recompiled
    CHECK(outcome.ok);
    CHECK(read_all(stem.string() + ".cubin") != foreign);
  }
}

TEST_CASE("entries and files that are symbolic links are never followed") {
  test::TempDir dir, outside;
  REQUIRE(compile_into(dir.path()).ok);
  const fs::path stem = entry_stem(dir.path(), kVariant);
  const fs::path target = outside.path() / "victim.json";
  write_all(target, read_all(stem.string() + ".json"));
  fs::remove(stem.string() + ".json");
  fs::create_symlink(target, stem.string() + ".json");
  KernelCache cache(CacheOptions{dir.path()});
  CHECK(cache.list().empty());
  const CompileOutcome outcome = cache.compile(kVariant);
  CHECK_FALSE(outcome.was_cached);
  CHECK(read_all(target).size() > 0);  // the link's target is untouched
  // No write probe: a planted link where a probe file used to go is never opened or created.
  test::TempDir fresh;
  const fs::path planted_target = outside.path() / "created-through-a-link";
  fs::create_symlink(planted_target, fresh.path() / fmt::format(".tmp.probe.{}", ::getpid()));
  KernelCache probe(CacheOptions{fresh.path()});
  CHECK(probe.directory().has_value());
  CHECK_FALSE(fs::exists(planted_target));
}

TEST_CASE("without HOME the cache is in the passwd entry's home, never a shared temp dir") {
  ScopedEnv home("HOME", nullptr), dir("FLASHJIT_CACHE_DIR", nullptr),
      xdg("XDG_CACHE_HOME", nullptr), path("FLASHJIT_CACHE_PATH", nullptr);
  const detail::CacheLocation location = detail::resolve_cache_location({});
  REQUIRE(location.writable.has_value());
  CHECK(location.writable->string().find(fs::temp_directory_path().string()) != 0);
  CHECK(location.writable->filename() == "flashjit");
  CHECK(location.writable_source.find("passwd") != std::string::npos);
}

TEST_CASE("read-only layers are served and never written; list says where each entry is") {
  test::TempDir bundle, writable;
  REQUIRE(compile_into(bundle.path()).ok);
  const auto bundle_files = std::distance(fs::directory_iterator(bundle.path()), {});
  KernelCache cache(CacheOptions{writable.path(), {bundle.path()}});
  REQUIRE(cache.layers().size() == 2);
  CHECK_FALSE(cache.layers()[1].writable);
  const CompileOutcome served = cache.compile(kVariant);
  CHECK(served.ok);
  CHECK(served.was_cached);
  CHECK(served.entry->read_only);
  CHECK(served.entry->layer == bundle.path());
  REQUIRE(cache.compile(kOther).ok);  // a miss everywhere goes to the writable layer
  const auto entries = cache.list();
  REQUIRE(entries.size() == 2);
  for (const CacheEntry& e : entries) CHECK(e.read_only == (e.layer == bundle.path()));
  CHECK(cache.clear() == 1);  // only the writable layer's entry
  CHECK(cache.prune(0) == 0);
  CHECK(std::distance(fs::directory_iterator(bundle.path()), {}) == bundle_files);
  // The same through FLASHJIT_CACHE_PATH.
  ScopedEnv path("FLASHJIT_CACHE_PATH",
                 fmt::format("{}:{}", writable.path().string(), bundle.path().string()).c_str());
  KernelCache from_env;
  REQUIRE(from_env.layers().size() == 2);
  CHECK(from_env.compile(kVariant).was_cached);
}

TEST_CASE("a cache directory that cannot be written (a read-only mount) is served read-only") {
  if (!is_root()) {
    MESSAGE("SKIPPED: read-only mount test needs root (mount)");
    return;
  }
  test::TempDir parent;
  const fs::path dir = parent.path() / "image";
  fs::create_directories(dir);
  if (::mount("tmpfs", dir.c_str(), "tmpfs", 0, "size=8m,mode=0755") != 0) {
    MESSAGE("SKIPPED: cannot mount a tmpfs: " << std::strerror(errno));
    return;
  }
  struct Unmount {
    fs::path dir;
    ~Unmount() { ::umount2(dir.c_str(), MNT_DETACH); }
  } unmount{dir};
  REQUIRE(compile_into(dir).ok);
  REQUIRE(::mount(nullptr, dir.c_str(), nullptr, MS_REMOUNT | MS_RDONLY, "mode=0755") == 0);
  KernelCache cache(CacheOptions{dir});
  CHECK_FALSE(cache.directory().has_value());
  CHECK(cache.why_not_persistent().find("served read-only") != std::string::npos);
  CHECK(cache.list().size() == 1);
  const CompileOutcome outcome = cache.compile(kVariant);
  CHECK(outcome.was_cached);  // served from the read-only directory, no recompile
}

TEST_CASE("kernel sources that cannot be read make entries unknown, and prune keeps them") {
  test::TempDir dir;
  REQUIRE(compile_into(dir.path()).ok);
  ScopedEnv kernels("FLASHJIT_KERNELS_DIR", "/nonexistent/flashjit-kernels");
  KernelCache cache(CacheOptions{dir.path()});
  const auto entries = cache.list();
  REQUIRE(entries.size() == 1);
  CHECK(entries[0].state == EntryState::unknown);
  CHECK(cache.remove_stale() == 0);
  CHECK(cache.list().size() == 1);
}

TEST_CASE("a FIFO or a huge sparse file in the cache neither hangs nor exhausts memory") {
  test::TempDir dir;
  REQUIRE(compile_into(dir.path()).ok);
  const fs::path stem = entry_stem(dir.path(), kOther);
  REQUIRE(::mkfifo((dir.path() / "planted.json").c_str(), 0600) == 0);
  REQUIRE(::mkfifo((stem.string() + ".json").c_str(), 0600) == 0);  // where kOther's goes
  {
    const int fd = ::open((dir.path() / "huge.json").c_str(), O_CREAT | O_WRONLY, 0644);
    REQUIRE(fd >= 0);
    REQUIRE(::ftruncate(fd, off_t{3} << 30) == 0);  // 3 GB, sparse
    ::close(fd);
  }
  auto run = std::async(std::launch::async, [&] {
    const auto start = std::chrono::steady_clock::now();
    KernelCache cache(CacheOptions{dir.path()});
    const std::size_t listed = cache.list().size();
    const CompileOutcome other = cache.compile(kOther);
    return std::tuple(listed, other.ok, std::chrono::steady_clock::now() - start);
  });
  REQUIRE(run.wait_for(std::chrono::seconds(60)) == std::future_status::ready);
  const auto [listed, other_ok, took] = run.get();
  CHECK(listed == 1);
  CHECK(other_ok);  // the FIFO in its place is replaced by the real metadata
  CHECK(took < std::chrono::seconds(30));
}

TEST_CASE("a store racing a prune retries and publishes a valid entry") {
  test::TempDir dir;
  const detail::DiskCache disk(CacheOptions{dir.path()});
  detail::KernelStore store(CacheOptions{dir.path() / "source"});
  const auto compiled = store.get(kVariant, detail::kernel_spec(kVariant));
  std::atomic<bool> done{false};
  std::thread pruner([&] {
    while (!done) disk.prune(0);
  });
  int errors = 0;
  for (int i = 0; i < 300; ++i) {
    detail::CompiledKernel kernel = *compiled;
    kernel.key = fmt::format("{:032x}", i % 4);
    const std::string error = disk.store(kernel);
    if (!error.empty()) {
      ++errors;
      MESSAGE(error);
    }
  }
  done = true;
  pruner.join();
  CHECK(errors == 0);
}

TEST_CASE("read-only commands delete nothing, and writers delete only their own old temp files") {
  test::TempDir dir;
  REQUIRE(compile_into(dir.path()).ok);
  const fs::path not_ours = dir.path() / ".tmp.notes";
  const fs::path a_directory = dir.path() / ".tmp.d";
  const fs::path killed_writer = dir.path() / ".tmp.simt.sm80.bf16.d32.m64n64s1.0.cubin.99.ab.3";
  write_all(not_ours, "someone's notes");
  fs::create_directory(a_directory);
  write_all(killed_writer, "half a cubin");
  const auto old = fs::file_time_type::clock::now() - std::chrono::hours(1);
  for (const fs::path& p : {not_ours, a_directory, killed_writer}) fs::last_write_time(p, old);
  {
    KernelCache cache(CacheOptions{dir.path()});
    cache.list();
  }
  CHECK(fs::exists(killed_writer));  // list wrote nothing, so it cleaned nothing
  KernelCache(CacheOptions{dir.path()}).prune(std::numeric_limits<std::uint64_t>::max());
  CHECK_FALSE(fs::exists(killed_writer));
  CHECK(fs::exists(not_ours));
  CHECK(fs::exists(a_directory));
}

TEST_CASE("C precompile refuses a NULL name and reports when nothing could be cached") {
  test::TempDir dir;
  const char* names[] = {"simt.sm80.bf16.d32.m64n64s1", nullptr};
  CHECK(flashjit_precompile(dir.path().c_str(), names, 2) == FLASHJIT_INVALID_ARGUMENT);
  CHECK(std::string(flashjit_last_error()).find("variant_names[1] is null") != std::string::npos);
  ::chmod(dir.path().c_str(), 0777);  // not a directory the cache may use
  CHECK(flashjit_precompile(dir.path().c_str(), names, 1) == FLASHJIT_CACHE_ERROR);
  CHECK(std::string(flashjit_last_error()).find("nothing can be cached") != std::string::npos);
}

TEST_CASE("variants that no GPU of their arch could launch are refused at precompile") {
  CHECK_THROWS_WITH_AS(Variant::parse("simt.sm80.bf16.d256.m256n256s1"),
                       doctest::Contains("shared memory per block: expected at most 166912"),
                       Error);
  CHECK_NOTHROW(Variant::parse("simt.sm80.bf16.d256.m64n64s1"));
}

TEST_CASE("log level names are checked the same way wherever they come from") {
  CHECK_NOTHROW(set_log_level("WARN"));
  CHECK_NOTHROW(set_log_level("warning"));
  CHECK_THROWS_WITH_AS(set_log_level("garbage"), doctest::Contains("expected trace, debug"), Error);
  set_log_level("warn");
}

TEST_CASE("a driver error the driver has no name for is still described") {
  const std::string text = detail::describe(static_cast<CUresult>(12345), "cuSomething");
  CHECK(text.find("cuSomething failed") != std::string::npos);
  CHECK(text.find("12345") != std::string::npos);
}

TEST_CASE("a group-shared cache (FLASHJIT_CACHE_SHARED=1) trusts its group and nobody else") {
  if (!is_root()) {
    MESSAGE("SKIPPED: group-shared test needs root (chown)");
    return;
  }
  test::TempDir dir;
  const gid_t group = ::getegid();
  REQUIRE(::chown(dir.path().c_str(), kStranger, group) == 0);  // another owner, our group
  ::chmod(dir.path().c_str(), 02770);
  CHECK_FALSE(KernelCache(CacheOptions{dir.path()}).directory().has_value());  // private rule
  ScopedEnv shared("FLASHJIT_CACHE_SHARED", "1");
  KernelCache cache(CacheOptions{dir.path()});
  REQUIRE(cache.directory().has_value());
  REQUIRE(cache.compile(kVariant).ok);
  CHECK(KernelCache(CacheOptions{dir.path()}).compile(kVariant).was_cached);
  // An entry of another group is not trusted, even here.
  const fs::path stem = entry_stem(dir.path(), kVariant);
  REQUIRE(::chown((stem.string() + ".cubin").c_str(), kStranger, group + 1) == 0);
  CHECK_FALSE(KernelCache(CacheOptions{dir.path()}).compile(kVariant).was_cached);
  // A world-writable shared directory is not used.
  ::chmod(dir.path().c_str(), 02777);
  CHECK_FALSE(KernelCache(CacheOptions{dir.path()}).directory().has_value());
}

// Crash safety of the disk cache, tried the hard way: writers SIGKILLed at random points, 8
// processes x 4 threads compiling and loading one directory, and a disk that fills up. After each,
// every entry on disk is valid or absent: never torn, never describing another cubin.
#include <doctest/doctest.h>
#include <fmt/format.h>
#include <signal.h>
#include <sys/mount.h>
#include <sys/statvfs.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <chrono>
#include <cstdint>
#include <cstring>
#include <fstream>
#include <functional>
#include <map>
#include <limits>
#include <random>
#include <set>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

#include "families/registry.hpp"
#include "flashjit/flashjit.hpp"
#include "jit/disk_cache.hpp"
#include "jit/kernel_store.hpp"
#include "temp_dir.hpp"

using namespace flashjit;
namespace fs = std::filesystem;

namespace {

// Small variants, so NVRTC takes a fraction of a second each.
const std::vector<Variant>& small_variants() {
  static const std::vector<Variant> variants = {
      Variant::parse("simt.sm80.bf16.d32.m64n64s1"),
      Variant::parse("simt.sm80.fp16.d32.m64n64s1"),
      Variant::parse("simt.sm86.bf16.d64.m64n64s1.causal"),
  };
  return variants;
}

std::string read_all(const fs::path& path) {
  std::ifstream file(path, std::ios::binary);
  std::ostringstream text;
  text << file.rdbuf();
  return text.str();
}

bool is_temp(const fs::path& path) { return path.filename().string().starts_with(".tmp."); }

// A cubin cut short loses its section header table, which ELF keeps at the end of the file.
bool elf_is_complete(const std::string& bytes) {
  if (bytes.size() < 64 ||
      bytes.compare(0, 4,
                    "\x7f"
                    "ELF") != 0 ||
      bytes[4] != 2)
    return false;
  std::uint64_t section_headers = 0;
  std::uint16_t entry_size = 0, entries = 0;
  std::memcpy(&section_headers, bytes.data() + 0x28, 8);
  std::memcpy(&entry_size, bytes.data() + 0x3a, 2);
  std::memcpy(&entries, bytes.data() + 0x3c, 2);
  return entries > 0 && section_headers + std::uint64_t{entry_size} * entries <= bytes.size();
}

// What a cache directory holds, judged file by file the way DiskCache::load judges it.
struct CacheAudit {
  int entries = 0;        // metadata that parses, next to the cubin it describes
  int orphan_cubins = 0;  // a complete cubin whose writer died before its metadata: not an entry
  std::vector<fs::path> temps;
  std::map<std::string, int> entries_per_variant;
  std::vector<std::string> problems;  // anything torn or inconsistent

  int entries_of(const Variant& variant) const {
    const auto it = entries_per_variant.find(variant.name());
    return it == entries_per_variant.end() ? 0 : it->second;
  }
};

// `cubin_is_complete` judges a cubin no metadata describes; by default, its ELF structure.
CacheAudit audit(
    const fs::path& dir,
    const std::function<bool(const fs::path&, const std::string&)>& cubin_is_complete =
        [](const fs::path&, const std::string& bytes) { return elf_is_complete(bytes); }) {
  CacheAudit result;
  std::set<fs::path> described;
  for (const auto& item : fs::directory_iterator(dir)) {
    const fs::path& path = item.path();
    if (is_temp(path)) {
      result.temps.push_back(path);
      continue;
    }
    if (path.extension() != ".json") continue;
    std::string why;
    const auto meta = detail::parse_metadata(read_all(path), &why);
    if (!meta) {
      result.problems.push_back(
          fmt::format("{}: torn or unreadable metadata: {}", path.string(), why));
      continue;
    }
    const std::string stem =
        fmt::format("{}.{}", meta->entry.variant.name(), meta->key.substr(0, 16));
    if (path.stem() != stem)
      result.problems.push_back(fmt::format("{} describes {}", path.string(), stem));
    fs::path cubin = path;
    cubin.replace_extension(".cubin");
    described.insert(cubin);
    if (!fs::exists(cubin)) {
      result.problems.push_back(fmt::format("{}: metadata without its cubin", path.string()));
    } else if (!meta->describes(read_all(cubin))) {
      result.problems.push_back(
          fmt::format("{}: cubin does not match its metadata", cubin.string()));
    } else {
      ++result.entries;
      ++result.entries_per_variant[meta->entry.variant.name()];
    }
  }
  for (const auto& item : fs::directory_iterator(dir)) {
    const fs::path& path = item.path();
    if (is_temp(path) || path.extension() != ".cubin" || described.count(path)) continue;
    ++result.orphan_cubins;
    if (!cubin_is_complete(path, read_all(path)))
      result.problems.push_back(fmt::format("{}: torn cubin", path.string()));
  }
  return result;
}

void check_no_problems(const CacheAudit& result) {
  for (const auto& problem : result.problems) FAIL_CHECK(problem);
}

// Runs `body` in a child process; its return value is the exit status (an exception: 2).
pid_t spawn(const std::function<int()>& body) {
  const pid_t pid = ::fork();
  REQUIRE(pid >= 0);
  if (pid == 0) {
    int status = 2;
    try {
      status = body();
    } catch (const std::exception& e) {
      std::fprintf(stderr, "child %d: %s\n", ::getpid(), e.what());
    }
    ::_exit(status);
  }
  return pid;
}

int wait_for(pid_t pid) {
  int status = 0;
  while (::waitpid(pid, &status, 0) < 0 && errno == EINTR) {
  }
  return status;
}

// Kills each child after its own random delay in [0, max_delay_ms]. Returns how many were still
// running when their signal came (the others had already finished their work).
int kill_at_random(const std::vector<pid_t>& children, std::mt19937& rng, int max_delay_ms) {
  std::vector<int> delays;
  for (size_t i = 0; i < children.size(); ++i)
    delays.push_back(std::uniform_int_distribution<int>(0, max_delay_ms)(rng));
  const auto start = std::chrono::steady_clock::now();
  std::vector<size_t> order(children.size());
  for (size_t i = 0; i < order.size(); ++i) order[i] = i;
  std::sort(order.begin(), order.end(), [&](size_t a, size_t b) { return delays[a] < delays[b]; });
  int killed = 0;
  for (size_t i : order) {
    std::this_thread::sleep_until(start + std::chrono::milliseconds(delays[i]));
    ::kill(children[i], SIGKILL);
  }
  for (pid_t pid : children) {
    const int status = wait_for(pid);
    killed += WIFSIGNALED(status) && WTERMSIG(status) == SIGKILL;
  }
  return killed;
}

// A content key (32 hex digits) whose 16-digit file-name prefix differs per slot.
std::string slot_key(int slot) { return fmt::format("{:016x}{:016x}", 0xfeed0000u + slot, slot); }

}  // namespace

TEST_CASE("writers SIGKILLed at random points leave every entry valid or absent") {
  test::TempDir dir;
  const unsigned seed = std::random_device{}();
  INFO("random seed ", seed);
  std::mt19937 rng(seed);

  // One compile, timed: the kill window must span a whole precompile on this machine, however
  // loaded it is, so that kills land in publishing too and not only in NVRTC.
  test::TempDir elsewhere;
  const auto compile_start = std::chrono::steady_clock::now();
  const Variant first = small_variants()[0];
  const auto compiled =
      detail::KernelStore(CacheOptions{elsewhere.path()}).get(first, detail::kernel_spec(first));
  const auto compile_ms = std::chrono::duration_cast<std::chrono::milliseconds>(
                              std::chrono::steady_clock::now() - compile_start)
                              .count();
  const int kill_window_ms =
      std::max<int>(400, static_cast<int>(compile_ms) * static_cast<int>(small_variants().size()));

  // Real precompiles, killed anywhere: during NVRTC, while writing, or between cubin and metadata.
  // Every other round starts from a cleared cache; the rounds between find earlier entries and
  // load them while the others compile.
  constexpr int kPrecompileRounds = 12, kPrecompilers = 2;
  int killed_precompiles = 0, published = 0;
  for (int round = 0; round < kPrecompileRounds; ++round) {
    if (round % 2 == 0) KernelCache(CacheOptions{dir.path()}).clear();
    std::vector<pid_t> children;
    for (int i = 0; i < kPrecompilers; ++i)
      children.push_back(spawn([&] {
        KernelCache cache(CacheOptions{dir.path()});
        cache.precompile(small_variants(), 1);
        return 0;
      }));
    killed_precompiles += kill_at_random(children, rng, kill_window_ms);
    const CacheAudit round_state = audit(dir.path());
    check_no_problems(round_state);
    published += round_state.entries;
  }

  // The publish path itself, killed mid-write: writers that do nothing but store (temp file,
  // fsync, link, metadata rename) into the same 8 entries, each with its own cubin bytes, as
  // processes whose NVRTC output differs would. The first cubin wins; metadata must describe it.
  constexpr int kStoreRounds = 30, kStorers = 3, kSlots = 8;
  std::vector<std::string> cubins;
  for (int i = 0; i < kStorers; ++i)
    cubins.push_back(compiled->cubin + std::string(16 + i, char('a' + i)));
  int killed_storers = 0;
  for (int round = 0; round < kStoreRounds; ++round) {
    std::vector<pid_t> children;
    for (int i = 0; i < kStorers; ++i)
      children.push_back(spawn([&, i, round] {
        const detail::DiskCache disk(CacheOptions{dir.path()});
        detail::CompiledKernel kernel = *compiled;
        kernel.cubin = cubins[i];
        for (int n = round;; ++n) {
          kernel.key = slot_key(n % kSlots);
          disk.store(kernel);
        }
        return 0;
      }));
    killed_storers += kill_at_random(children, rng, 400);
    // The storers' cubins are known byte for byte; the precompilers' are judged as ELF.
    check_no_problems(audit(dir.path(), [&](const fs::path& path, const std::string& bytes) {
      if (path.string().find(".00000000feed") == std::string::npos) return elf_is_complete(bytes);
      return std::find(cubins.begin(), cubins.end(), bytes) != cubins.end();
    }));
  }
  const CacheAudit after_kills = audit(dir.path());
  check_no_problems(after_kills);
  CHECK(killed_storers == kStoreRounds * kStorers);  // storers never finish: every one was killed
  MESSAGE(fmt::format(
      "{} of {} precompiling processes SIGKILLed within {} ms ({} entries "
      "seen over the rounds), {} storing processes SIGKILLed within 400 ms: {} valid entries, "
      "{} orphan cubins, {} temp files left",
      killed_precompiles, kPrecompileRounds * kPrecompilers, kill_window_ms, published,
      killed_storers, after_kills.entries, after_kills.orphan_cubins, after_kills.temps.size()));

  // Temp files of killed writers go once they are 10 minutes old; a young one may belong to a
  // live writer and stays.
  const auto now = fs::file_time_type::clock::now();
  for (const fs::path& temp : after_kills.temps)
    fs::last_write_time(temp, now - std::chrono::minutes(11));
  const fs::path live_writer_temp = dir.path() / ".tmp.simt.sm80.bf16.d32.m64n64s1.0.cubin.1.0.0";
  std::ofstream(live_writer_temp) << "being written";
  // Writers clean up (a read-only command such as `list` deletes nothing): the first write of a
  // process, here a prune that removes no entry.
  KernelCache reopened(CacheOptions{dir.path()});
  CHECK(audit(dir.path()).temps.size() == after_kills.temps.size() + 1);
  reopened.prune(std::numeric_limits<std::uint64_t>::max());
  const CacheAudit cleaned = audit(dir.path());
  CHECK(cleaned.temps == std::vector<fs::path>{live_writer_temp});
  CHECK(cleaned.entries == after_kills.entries);
  check_no_problems(cleaned);

  // And the cache works: every variant is served (from disk, or compiled again if its writer died).
  for (const CompileOutcome& outcome : reopened.precompile(small_variants())) {
    INFO(outcome.variant.name(), ": ", outcome.error);
    CHECK(outcome.ok);
  }
  check_no_problems(audit(dir.path()));
  KernelCache third(CacheOptions{dir.path()});
  for (const Variant& variant : small_variants()) CHECK(third.compile(variant).was_cached);
}

TEST_CASE("8 processes x 4 threads compiling and loading one directory: no error, one entry each") {
  test::TempDir dir;
  constexpr int kProcesses = 8, kThreads = 4;
  std::vector<pid_t> children;
  for (int p = 0; p < kProcesses; ++p)
    children.push_back(spawn([&, p] {
      KernelCache shared(CacheOptions{dir.path()});  // as an Engine's cache: all threads share it
      std::vector<std::string> errors(kThreads);
      std::vector<std::thread> threads;
      for (int t = 0; t < kThreads; ++t)
        threads.emplace_back([&, t] {
          std::vector<Variant> order = small_variants();
          std::shuffle(order.begin(), order.end(), std::mt19937(p * kThreads + t));
          for (const Variant& variant : order) {
            const CompileOutcome outcome = shared.compile(variant);
            if (!outcome.ok) errors[t] += fmt::format("{}: {}\n", variant.name(), outcome.error);
          }
          // A cache of its own must now find every variant on disk, hash-verified, while the
          // other processes may still be publishing.
          KernelCache fresh(CacheOptions{dir.path()});
          for (const Variant& variant : order) {
            const CompileOutcome outcome = fresh.compile(variant);
            if (!outcome.ok || !outcome.was_cached)
              errors[t] += fmt::format("{}: reload {} ({})\n", variant.name(),
                                       outcome.ok ? "compiled again" : "failed", outcome.error);
          }
        });
      for (auto& thread : threads) thread.join();
      int failed_threads = 0;
      for (const auto& error : errors) {
        if (error.empty()) continue;
        std::fprintf(stderr, "process %d: %s", p, error.c_str());
        ++failed_threads;
      }
      return failed_threads == 0 ? 0 : 1;
    }));
  for (pid_t pid : children) {
    const int status = wait_for(pid);
    CHECK(WIFEXITED(status));
    CHECK(WEXITSTATUS(status) == 0);
  }
  const CacheAudit result = audit(dir.path());
  check_no_problems(result);
  CHECK(result.temps.empty());
  CHECK(result.orphan_cubins == 0);
  CHECK(result.entries == static_cast<int>(small_variants().size()));
  for (const Variant& variant : small_variants()) CHECK(result.entries_of(variant) == 1);
  CHECK(KernelCache(CacheOptions{dir.path()}).list().size() == small_variants().size());
}

namespace {

// A tmpfs of a given size, unmounted at scope exit. Mounting needs root (CAP_SYS_ADMIN).
class SmallDisk {
 public:
  SmallDisk(const fs::path& where, std::size_t bytes) : path_(where) {
    fs::create_directories(path_);
    // mode=0700: a cache directory must be writable by this user alone (docs/cache.md).
    const std::string options = fmt::format("size={},mode=0700", bytes);
    if (::mount("tmpfs", path_.c_str(), "tmpfs", 0, options.c_str()) == 0)
      mounted_ = true;
    else
      why_ = std::strerror(errno);
  }
  ~SmallDisk() {
    if (mounted_) ::umount2(path_.c_str(), MNT_DETACH);
  }
  SmallDisk(const SmallDisk&) = delete;
  SmallDisk& operator=(const SmallDisk&) = delete;
  bool mounted() const { return mounted_; }
  const std::string& why_not() const { return why_; }
  const fs::path& path() const { return path_; }
  std::uint64_t free_bytes() const {
    struct statvfs stats {};
    ::statvfs(path_.c_str(), &stats);
    return std::uint64_t{stats.f_bavail} * stats.f_frsize;
  }

 private:
  fs::path path_;
  bool mounted_ = false;
  std::string why_;
};

std::vector<fs::path> files_in(const fs::path& dir) {
  std::vector<fs::path> files;
  for (const auto& item : fs::directory_iterator(dir)) files.push_back(item.path());
  return files;
}

constexpr std::uint64_t kPage = 4096;  // tmpfs allocates whole pages

}  // namespace

TEST_CASE("a full disk gives a clear error and leaves no torn entry") {
  test::TempDir dir;
  const Variant variant = small_variants()[0];
  const CompileOutcome reference = KernelCache(CacheOptions{dir.path() / "roomy"}).compile(variant);
  REQUIRE(reference.ok);
  const std::uint64_t cubin_bytes = reference.entry->cubin_bytes;

  SUBCASE("no room for the cubin") {
    SmallDisk disk(dir.path() / "tiny", 4 * kPage);
    if (!disk.mounted()) {
      MESSAGE("SKIPPED: full-disk test not run: cannot mount a tmpfs (" << disk.why_not() << ")");
      return;
    }
    REQUIRE(cubin_bytes > disk.free_bytes());
    KernelCache cache(CacheOptions{disk.path()});
    REQUIRE(cache.directory().has_value());
    const CompileOutcome outcome = cache.compile(variant);
    CHECK_FALSE(outcome.ok);
    CHECK(outcome.error.find("not cached") != std::string::npos);
    CHECK(outcome.error.find(std::strerror(ENOSPC)) != std::string::npos);
    MESSAGE("error: " << outcome.error);
    CHECK(files_in(disk.path()).empty());                             // not even a temp file
    CHECK(cache.compile(variant).entry->cubin_bytes == cubin_bytes);  // still usable from memory
  }

  SUBCASE("room for the cubin but not its metadata") {
    SmallDisk disk(dir.path() / "almost-full",
                   64 * kPage + (cubin_bytes + kPage - 1) / kPage * kPage);
    if (!disk.mounted()) {
      MESSAGE("SKIPPED: full-disk test not run: cannot mount a tmpfs (" << disk.why_not() << ")");
      return;
    }
    // Fill it so that exactly the cubin's pages are left.
    const fs::path filler = disk.path() / "filler";
    const std::uint64_t cubin_pages = (cubin_bytes + kPage - 1) / kPage;
    std::ofstream(filler, std::ios::binary)
        << std::string(disk.free_bytes() - cubin_pages * kPage, 'x');
    REQUIRE(disk.free_bytes() == cubin_pages * kPage);

    const CompileOutcome outcome = KernelCache(CacheOptions{disk.path()}).compile(variant);
    CHECK_FALSE(outcome.ok);
    CHECK(outcome.error.find(std::strerror(ENOSPC)) != std::string::npos);
    MESSAGE("error: " << outcome.error);
    // The cubin was published whole, its metadata never was: not an entry, and nothing torn.
    const CacheAudit full = audit(disk.path());
    check_no_problems(full);
    CHECK(full.entries == 0);
    CHECK(full.orphan_cubins == 1);
    CHECK(full.temps.empty());
    CHECK(KernelCache(CacheOptions{disk.path()}).list().empty());

    // With space again, the next writer adopts that cubin and completes the entry.
    fs::remove(filler);
    KernelCache later(CacheOptions{disk.path()});
    const CompileOutcome retry = later.compile(variant);
    CHECK(retry.ok);
    const CacheAudit repaired = audit(disk.path());
    check_no_problems(repaired);
    CHECK(repaired.entries == 1);
    CHECK(repaired.orphan_cubins == 0);
    CHECK(later.list().size() == 1);
  }
}

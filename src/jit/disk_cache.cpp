#include "jit/disk_cache.hpp"

#include <fcntl.h>
#include <fmt/chrono.h>
#include <fmt/format.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cerrno>
#include <cstring>
#include <fstream>
#include <random>
#include <sstream>
#include <utility>

#include "core/log.hpp"

namespace flashjit::detail {
namespace fs = std::filesystem;

namespace {

constexpr std::string_view kTempPrefix = ".tmp.";

std::optional<std::string> read_file(const fs::path& path) {
  std::ifstream file(path, std::ios::binary);
  if (!file) return std::nullopt;
  std::ostringstream text;
  text << file.rdbuf();
  if (file.bad()) return std::nullopt;
  return text.str();
}

// A unique temp file in `dir` holding `bytes`, fsynced. Returns an error message, empty on
// success; a failure leaves no temp file behind.
std::string write_temp(const fs::path& target, const std::string& bytes, fs::path& temp) {
  static std::atomic<unsigned> counter{0};
  static const unsigned long long salt = std::random_device{}();
  temp = target.parent_path() / fmt::format("{}{}.{}.{:x}.{}", kTempPrefix,
                                            target.filename().string(), getpid(), salt, counter++);
  int fd = ::open(temp.c_str(), O_WRONLY | O_CREAT | O_EXCL | O_CLOEXEC, 0644);
  if (fd < 0) return fmt::format("cannot create {}: {}", temp.string(), std::strerror(errno));
  const char* data = bytes.data();
  size_t left = bytes.size();
  std::string error;
  while (left > 0 && error.empty()) {
    ssize_t written = ::write(fd, data, left);
    if (written < 0 && errno == EINTR) continue;
    if (written <= 0) error = fmt::format("cannot write {}: {}", temp.string(), std::strerror(errno));
    else { data += written; left -= static_cast<size_t>(written); }
  }
  if (error.empty() && ::fsync(fd) != 0)
    error = fmt::format("cannot fsync {}: {}", temp.string(), std::strerror(errno));
  if (::close(fd) != 0 && error.empty())
    error = fmt::format("cannot close {}: {}", temp.string(), std::strerror(errno));
  if (!error.empty()) ::unlink(temp.c_str());
  return error;
}

// Replaces `target` atomically with `bytes` (temp file + rename).
std::string replace_atomically(const fs::path& target, const std::string& bytes) {
  fs::path temp;
  std::string error = write_temp(target, bytes, temp);
  if (error.empty() && ::rename(temp.c_str(), target.c_str()) != 0) {
    error = fmt::format("cannot rename into {}: {}", target.string(), std::strerror(errno));
    ::unlink(temp.c_str());
  }
  return error;
}

// Publishes `bytes` at `target` unless a complete file is already there; either way `published`
// ends up holding the bytes that `target` holds. NVRTC output can differ between processes, so
// the first writer's cubin wins and is never replaced: metadata written for it stays true.
std::string publish_once(const fs::path& target, const std::string& bytes, std::string& published) {
  fs::path temp;
  std::string error = write_temp(target, bytes, temp);
  if (!error.empty()) return error;
  const int linked = ::link(temp.c_str(), target.c_str());
  const int link_errno = errno;
  ::unlink(temp.c_str());
  if (linked == 0) {
    published = bytes;
    return {};
  }
  if (link_errno != EEXIST)
    return fmt::format("cannot link into {}: {}", target.string(), std::strerror(link_errno));
  auto existing = read_file(target);
  if (!existing) return fmt::format("cannot read {}", target.string());
  published = std::move(*existing);
  return {};
}

std::string iso_time(fs::file_time_type time) {
  auto system = std::chrono::file_clock::to_sys(time);
  return fmt::format("{:%Y-%m-%dT%H:%M:%SZ}",
                     fmt::gmtime(std::chrono::system_clock::to_time_t(
                         std::chrono::time_point_cast<std::chrono::system_clock::duration>(system))));
}

bool dir_is_usable(const fs::path& dir, std::string& why) {
  std::error_code ec;
  fs::create_directories(dir, ec);
  if (ec) {
    why = ec.message();
    return false;
  }
  const fs::path probe = dir / fmt::format("{}probe.{}", kTempPrefix, getpid());
  int fd = ::open(probe.c_str(), O_WRONLY | O_CREAT | O_CLOEXEC, 0644);
  if (fd < 0) {
    why = std::strerror(errno);
    return false;
  }
  ::close(fd);
  ::unlink(probe.c_str());
  return true;
}

}  // namespace

fs::path default_cache_dir() {
  if (const char* dir = std::getenv("FLASHJIT_CACHE_DIR"); dir && *dir) return dir;
  if (const char* xdg = std::getenv("XDG_CACHE_HOME"); xdg && *xdg) return fs::path(xdg) / "flashjit";
  if (const char* home = std::getenv("HOME"); home && *home)
    return fs::path(home) / ".cache" / "flashjit";
  return fs::temp_directory_path() / "flashjit";
}

DiskCache::DiskCache(std::optional<fs::path> dir) : dir_(dir ? *dir : default_cache_dir()) {
  std::string why;
  persistent_ = dir_is_usable(dir_, why);
  if (!persistent_) {
    log().warn("cache directory {} is not usable ({}); compiled kernels are kept in memory only",
               dir_.string(), why);
    return;
  }
  remove_stale_temps(std::chrono::minutes(10));
}

fs::path DiskCache::entry_stem(const Variant& variant, const std::string& key) const {
  return dir_ / fmt::format("{}.{}", variant.name(), key.substr(0, 16));
}

fs::path DiskCache::cubin_path(const Variant& variant, const std::string& key) const {
  return fs::path(entry_stem(variant, key).string() + ".cubin");
}

std::optional<CompiledKernel> DiskCache::load(const Variant& variant, const std::string& key) const {
  if (!persistent_) return std::nullopt;
  const fs::path stem = entry_stem(variant, key);
  const fs::path meta_path = fs::path(stem.string() + ".json");
  const fs::path cubin_path = fs::path(stem.string() + ".cubin");
  auto meta_text = read_file(meta_path);
  if (!meta_text) return std::nullopt;  // absent: a miss, not an error

  auto discard = [&](const std::string& why) -> std::optional<CompiledKernel> {
    log().warn("cache entry {} is invalid ({}); discarding and recompiling", stem.string(), why);
    // The cubin goes first: a cubin left without metadata (if we die here) must be a good one,
    // because the next writer adopts an existing cubin rather than replacing it.
    std::error_code ec;
    fs::remove(cubin_path, ec);
    fs::remove(meta_path, ec);
    return std::nullopt;
  };
  std::string why;
  auto kernel = parse_metadata(*meta_text, &why);
  if (!kernel) return discard(fmt::format("unreadable metadata: {}", why));
  if (kernel->key != key || !(kernel->entry.variant == variant))
    return discard("metadata names another key");
  auto cubin = read_file(cubin_path);
  if (!cubin) return discard("cubin missing");
  if (!kernel->describes(*cubin)) return discard("cubin fails its hash");
  kernel->cubin = std::move(*cubin);
  kernel->entry.cubin_path = cubin_path;
  // Last use, for prune's LRU order; a reader never takes a lock, so this is best effort.
  std::error_code ec;
  fs::last_write_time(cubin_path, fs::file_time_type::clock::now(), ec);
  return kernel;
}

std::string DiskCache::store(const CompiledKernel& kernel) const {
  if (!persistent_) return {};
  const fs::path stem = entry_stem(kernel.entry.variant, kernel.key);
  // The cubin first and the metadata last: a reader finds an entry only through its metadata,
  // and the metadata describes the cubin that is actually published.
  std::string published;
  std::string error = publish_once(fs::path(stem.string() + ".cubin"), kernel.cubin, published);
  if (error.empty())
    error = replace_atomically(fs::path(stem.string() + ".json"), metadata_json(kernel, published));
  if (!error.empty())
    log().warn("could not store {} in the cache: {}", kernel.entry.variant.name(), error);
  return error;
}

std::vector<CacheEntry> DiskCache::list(const std::optional<std::string>& arch) const {
  std::vector<CacheEntry> entries;
  if (!persistent_) return entries;
  std::error_code ec;
  for (const auto& item : fs::directory_iterator(dir_, ec)) {
    const fs::path& path = item.path();
    if (path.extension() != ".json" || path.filename().string().starts_with(kTempPrefix)) continue;
    auto text = read_file(path);
    if (!text) continue;
    std::string why;
    auto kernel = parse_metadata(*text, &why);
    if (!kernel) {
      log().debug("skipping unreadable cache metadata {}: {}", path.string(), why);
      continue;
    }
    CacheEntry entry = std::move(kernel->entry);
    if (arch && entry.variant.arch != *arch) continue;
    entry.cubin_path = path;
    entry.cubin_path.replace_extension(".cubin");
    std::error_code stat_error;
    entry.cubin_bytes = fs::file_size(entry.cubin_path, stat_error);
    if (stat_error) continue;  // metadata without its cubin: not an entry
    const auto last_used = fs::last_write_time(entry.cubin_path, stat_error);
    if (stat_error) continue;  // removed since (clear or prune in another process)
    entry.last_used = iso_time(last_used);
    entries.push_back(std::move(entry));
  }
  std::sort(entries.begin(), entries.end(),
            [](const CacheEntry& a, const CacheEntry& b) { return a.variant.name() < b.variant.name(); });
  return entries;
}

namespace {

// Metadata first, so no reader finds an entry whose cubin is gone. True if the entry was there.
bool remove_entry(const CacheEntry& entry) {
  std::error_code ec;
  fs::path meta = entry.cubin_path;
  meta.replace_extension(".json");
  const bool removed = fs::remove(meta, ec);
  fs::remove(entry.cubin_path, ec);
  return removed;
}

}  // namespace

std::size_t DiskCache::remove(const std::vector<CacheEntry>& entries) const {
  std::size_t removed = 0;
  for (const CacheEntry& entry : entries) removed += remove_entry(entry);
  return removed;
}

std::size_t DiskCache::prune(std::uint64_t max_bytes) const {
  auto entries = list(std::nullopt);
  std::uint64_t total = 0;
  for (const auto& e : entries) total += e.cubin_bytes;
  std::sort(entries.begin(), entries.end(),
            [](const CacheEntry& a, const CacheEntry& b) { return a.last_used < b.last_used; });
  std::size_t removed = 0;
  for (const CacheEntry& entry : entries) {
    if (total <= max_bytes) break;
    removed += remove_entry(entry);
    total -= entry.cubin_bytes;
  }
  return removed;
}

void DiskCache::remove_stale_temps(std::chrono::seconds age) const {
  std::error_code ec;
  const auto now = fs::file_time_type::clock::now();
  for (const auto& item : fs::directory_iterator(dir_, ec)) {
    if (!item.path().filename().string().starts_with(kTempPrefix)) continue;
    std::error_code stat_error;
    auto written = fs::last_write_time(item.path(), stat_error);
    if (!stat_error && now - written > age) fs::remove(item.path(), stat_error);
  }
}

}  // namespace flashjit::detail

#include "jit/disk_cache.hpp"

#include <fmt/chrono.h>
#include <fmt/format.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <utility>

#include "core/log.hpp"
#include "jit/cache_location.hpp"
#include "jit/cubin_check.hpp"

namespace flashjit::detail {
namespace fs = std::filesystem;

namespace {

constexpr int kPublishAttempts = 4;  // a concurrent prune may remove what we were about to adopt

fs::path with_extension(const fs::path& stem, const char* extension) {
  return fs::path(stem.string() + extension);
}

// Publishes `bytes` at `target` unless a complete file is already there; either way `published`
// ends up holding the bytes that `target` holds. NVRTC output can differ between processes, so
// the first writer's cubin wins and is never replaced: metadata written for it stays true. An
// existing cubin is adopted only when it passes the trust rule and is a cubin for `arch`.
std::string publish_once(const fs::path& target, const std::string& bytes, const TrustRule& rule,
                         std::string_view arch, std::string& published) {
  for (int attempt = 0; attempt < kPublishAttempts; ++attempt) {
    fs::path temp;
    if (std::string error = write_temp(target, bytes, temp); !error.empty()) return error;
    const int linked = ::link(temp.c_str(), target.c_str());
    const int link_errno = errno;
    ::unlink(temp.c_str());
    if (linked == 0) {
      published = bytes;
      return {};
    }
    if (link_errno != EEXIST)
      return fmt::format("cannot link into {}: {}", target.string(), std::strerror(link_errno));
    ReadResult existing = read_trusted(target, rule, kMaxCubinBytes);
    if (existing.absent) continue;  // removed between our link and our read: try again
    if (!existing.bytes)
      return fmt::format("refusing to adopt {}: {}", target.string(), existing.why);
    if (std::string wrong = cubin_mismatch(*existing.bytes, arch); !wrong.empty())
      return fmt::format("refusing to adopt {}: {}", target.string(), wrong);
    published = std::move(*existing.bytes);
    return {};
  }
  return fmt::format("cannot publish {}: removed by another process {} times in a row",
                     target.string(), kPublishAttempts);
}

std::string iso_time(std::time_t seconds) {
  return fmt::format("{:%Y-%m-%dT%H:%M:%SZ}", fmt::gmtime(seconds));
}

// Metadata first, so no reader finds an entry whose cubin is gone. True if the entry was there.
bool remove_entry(const fs::path& cubin_path) {
  std::error_code ec;
  const bool removed = fs::remove(fs::path(cubin_path).replace_extension(".json"), ec);
  fs::remove(cubin_path, ec);
  return removed;
}

}  // namespace

DiskCache::DiskCache(const CacheOptions& options) {
  const CacheLocation location = resolve_cache_location(options);
  if (location.writable) {
    const fs::path& dir = *location.writable;
    const DirectoryState state = check_directory(dir, trust_kind_for(false), /*create=*/true);
    if (state.usable && state.writable) {
      layers_.push_back({dir, true, state.rule});
    } else {
      // A directory that is ours (or root's) but cannot be written, such as a cache baked into a
      // read-only image, is still served.
      const DirectoryState read_only = check_directory(dir, trust_kind_for(true), false);
      const std::string source =
          fmt::format("cache directory {} (from {})", dir.string(), location.writable_source);
      if (read_only.usable) {
        layers_.push_back({dir, false, read_only.rule});
        why_not_persistent_ = fmt::format(
            "{} is not writable by this user: its entries are served "
            "read-only",
            source);
      } else {
        why_not_persistent_ = fmt::format("{} cannot be used: {}", source, state.why);
      }
    }
  } else {
    why_not_persistent_ = location.why_none;
  }
  for (const fs::path& dir : location.read_only) {
    const DirectoryState state = check_directory(dir, trust_kind_for(true), false);
    if (state.usable)
      layers_.push_back({dir, false, state.rule});
    else
      log().warn("read-only cache layer {} is not used: {}", dir.string(), state.why);
  }
  if (!layers_.empty() && layers_.front().writable) writable_ = &layers_.front();
  if (!writable_) log().warn("{}; new kernels are kept in memory only", why_not_persistent_);
}

const fs::path& DiskCache::directory() const {
  static const fs::path none;
  return writable_ ? writable_->dir : none;
}

fs::path DiskCache::cubin_path(const Variant& variant, const std::string& key) const {
  return directory() / fmt::format("{}.{}.cubin", variant.name(), key.substr(0, 16));
}

std::optional<CompiledKernel> DiskCache::load(const Variant& variant,
                                              const std::string& key) const {
  const std::string stem_name = fmt::format("{}.{}", variant.name(), key.substr(0, 16));
  for (const Layer& layer : layers_) {
    const fs::path stem = layer.dir / stem_name;
    const fs::path meta_path = with_extension(stem, ".json");
    const fs::path cubin_path = with_extension(stem, ".cubin");
    ReadResult meta_text = read_trusted(meta_path, layer.rule, kMaxMetadataBytes);
    if (meta_text.absent) continue;  // a miss in this layer
    auto reject = [&](const std::string& why) {
      if (!layer.writable) {
        log().warn("cache entry {} is not used ({}); looking further", stem.string(), why);
        return;
      }
      log().warn("cache entry {} is invalid ({}); discarding and recompiling", stem.string(), why);
      // The cubin goes first: a cubin left without metadata (if we die here) must be a good
      // one, because the next writer adopts an existing cubin rather than replacing it.
      std::error_code ec;
      fs::remove(cubin_path, ec);
      fs::remove(meta_path, ec);
    };
    if (!meta_text.bytes) {
      // Refused by the trust rule or unreadable: never delete what may not be ours.
      log().warn("cache entry {} is not used: {}", stem.string(), meta_text.why);
      continue;
    }
    std::string why;
    auto kernel = parse_metadata(*meta_text.bytes, &why);
    if (!kernel) {
      reject(fmt::format("unreadable metadata: {}", why));
      continue;
    }
    if (kernel->key != key || !(kernel->entry.variant == variant)) {
      reject("metadata names another key");
      continue;
    }
    ReadResult cubin = read_trusted(cubin_path, layer.rule, kMaxCubinBytes);
    if (!cubin.bytes) {
      if (cubin.absent)
        reject("cubin missing");
      else
        log().warn("cache entry {} is not used: {}", stem.string(), cubin.why);
      continue;
    }
    if (!kernel->describes(*cubin.bytes)) {
      reject("cubin fails its hash");
      continue;
    }
    if (std::string wrong = cubin_mismatch(*cubin.bytes, variant.arch); !wrong.empty()) {
      reject(wrong);
      continue;
    }
    kernel->cubin = std::move(*cubin.bytes);
    kernel->entry.cubin_path = cubin_path;
    kernel->entry.layer = layer.dir;
    kernel->entry.read_only = !layer.writable;
    // Last use, for prune's LRU order; a reader never takes a lock, so this is best effort.
    if (layer.writable) {
      std::error_code ec;
      fs::last_write_time(cubin_path, fs::file_time_type::clock::now(), ec);
    }
    return kernel;
  }
  return std::nullopt;
}

std::string DiskCache::store(const CompiledKernel& kernel) const {
  if (!writable_) return {};
  std::call_once(temps_cleaned_, [this] { remove_stale_temps(std::chrono::minutes(10)); });
  const fs::path stem =
      writable_->dir / fmt::format("{}.{}", kernel.entry.variant.name(), kernel.key.substr(0, 16));
  // The cubin first and the metadata last: a reader finds an entry only through its metadata,
  // and the metadata describes the cubin that is actually published.
  std::string published;
  std::string error = publish_once(with_extension(stem, ".cubin"), kernel.cubin, writable_->rule,
                                   kernel.entry.variant.arch, published);
  if (error.empty())
    error = replace_atomically(with_extension(stem, ".json"), metadata_json(kernel, published));
  if (!error.empty())
    log().warn("could not store {} in the cache: {}", kernel.entry.variant.name(), error);
  return error;
}

std::vector<CacheEntry> DiskCache::list_layer(const Layer& layer,
                                              const std::optional<std::string>& arch) const {
  std::vector<CacheEntry> entries;
  std::error_code ec;
  for (const auto& item : fs::directory_iterator(layer.dir, ec)) {
    const fs::path& path = item.path();
    const std::string name = path.filename().string();
    if (path.extension() != ".json" || name.starts_with(kTempPrefix)) continue;
    ReadResult text = read_trusted(path, layer.rule, kMaxMetadataBytes);
    if (!text.bytes) {
      if (!text.absent) log().debug("skipping cache metadata {}: {}", path.string(), text.why);
      continue;
    }
    std::string why;
    auto kernel = parse_metadata(*text.bytes, &why);
    if (!kernel) {
      log().debug("skipping unreadable cache metadata {}: {}", path.string(), why);
      continue;
    }
    CacheEntry entry = std::move(kernel->entry);
    if (arch && entry.variant.arch != *arch) continue;
    entry.cubin_path = fs::path(path).replace_extension(".cubin");
    entry.layer = layer.dir;
    entry.read_only = !layer.writable;
    struct stat st {};
    // Metadata without a (regular, trusted) cubin beside it is not an entry; nor is one removed
    // since by clear or prune in another process.
    if (::lstat(entry.cubin_path.c_str(), &st) != 0 || !S_ISREG(st.st_mode) ||
        !layer.rule.violation(st, entry.cubin_path).empty())
      continue;
    entry.cubin_bytes = static_cast<std::size_t>(st.st_size);
    entry.last_used = iso_time(st.st_mtim.tv_sec);
    entries.push_back(std::move(entry));
  }
  return entries;
}

std::vector<CacheEntry> DiskCache::list(const std::optional<std::string>& arch) const {
  std::vector<CacheEntry> entries;
  for (const Layer& layer : layers_) {
    std::vector<CacheEntry> found = list_layer(layer, arch);
    entries.insert(entries.end(), std::make_move_iterator(found.begin()),
                   std::make_move_iterator(found.end()));
  }
  std::stable_sort(entries.begin(), entries.end(), [](const CacheEntry& a, const CacheEntry& b) {
    return a.variant.name() < b.variant.name();
  });
  return entries;
}

std::size_t DiskCache::remove(const std::vector<CacheEntry>& entries) const {
  if (!writable_) return 0;
  std::size_t removed = 0;
  for (const CacheEntry& entry : entries)
    if (!entry.read_only && entry.cubin_path.parent_path() == writable_->dir)
      removed += remove_entry(entry.cubin_path);
  return removed;
}

std::size_t DiskCache::prune(std::uint64_t max_bytes) const {
  if (!writable_) return 0;
  std::call_once(temps_cleaned_, [this] { remove_stale_temps(std::chrono::minutes(10)); });
  auto entries = list_layer(*writable_, std::nullopt);
  std::uint64_t total = 0;
  for (const auto& e : entries) total += e.cubin_bytes;
  std::sort(entries.begin(), entries.end(),
            [](const CacheEntry& a, const CacheEntry& b) { return a.last_used < b.last_used; });
  std::size_t removed = 0;
  for (const CacheEntry& entry : entries) {
    if (total <= max_bytes) break;
    removed += remove_entry(entry.cubin_path);
    total -= entry.cubin_bytes;
  }
  return removed;
}

void DiskCache::remove_stale_temps(std::chrono::seconds age) const {
  if (!writable_) return;
  std::error_code ec;
  const auto now = fs::file_time_type::clock::now();
  for (const auto& item : fs::directory_iterator(writable_->dir, ec)) {
    const fs::path& path = item.path();
    if (!is_cache_temp_name(path.filename().string())) continue;
    struct stat st {};
    if (::lstat(path.c_str(), &st) != 0 || !S_ISREG(st.st_mode) || st.st_uid != ::geteuid())
      continue;
    std::error_code stat_error;
    const auto written = fs::last_write_time(path, stat_error);
    if (!stat_error && now - written > age) ::unlink(path.c_str());
  }
}

}  // namespace flashjit::detail

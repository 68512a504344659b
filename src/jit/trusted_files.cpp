#include "jit/trusted_files.hpp"

#include <fcntl.h>
#include <fmt/format.h>
#include <sys/stat.h>
#include <unistd.h>

#include <atomic>
#include <cerrno>
#include <cstdlib>
#include <cstring>
#include <random>
#include <regex>

namespace flashjit::detail {
namespace fs = std::filesystem;

namespace {

std::string errno_text(int error) { return std::strerror(error); }

// mkdir -p with mode 0700 for what it creates (a new cache is private from the start).
std::string make_private_directories(const fs::path& dir) {
  fs::path partial;
  for (const fs::path& part : dir) {
    partial /= part;
    if (::mkdir(partial.c_str(), 0700) != 0 && errno != EEXIST)
      return fmt::format("cannot create {}: {}", partial.string(), errno_text(errno));
  }
  return {};
}

bool in_my_groups(gid_t group) {
  if (group == ::getegid()) return true;
  const int count = ::getgroups(0, nullptr);
  std::vector<gid_t> groups(static_cast<std::size_t>(std::max(count, 0)));
  if (count > 0 && ::getgroups(count, groups.data()) == count)
    for (gid_t g : groups)
      if (g == group) return true;
  return false;
}

}  // namespace

std::string TrustRule::violation(const struct stat& st, const fs::path& path) const {
  const uid_t me = ::geteuid();
  const char* what = S_ISDIR(st.st_mode) ? "directory" : "file";
  switch (kind) {
    case Kind::private_to_user:
      if (st.st_uid != me)
        return fmt::format("{} {} belongs to uid {}, not to this user ({})", what, path.string(),
                           st.st_uid, me);
      if ((st.st_mode & 022) != 0)
        return fmt::format(
            "{} {} is writable by group or others (mode {:o}): run chmod go-w on "
            "it, or set FLASHJIT_CACHE_SHARED=1 for a group-shared cache",
            what, path.string(), st.st_mode & 07777);
      return {};
    case Kind::read_only_layer:
      if (st.st_uid != me && st.st_uid != 0)
        return fmt::format("{} {} belongs to uid {}, neither this user ({}) nor root", what,
                           path.string(), st.st_uid, me);
      if ((st.st_mode & 022) != 0)
        return fmt::format("{} {} is writable by group or others (mode {:o})", what, path.string(),
                           st.st_mode & 07777);
      return {};
    case Kind::group_shared:
      if ((st.st_mode & 002) != 0)
        return fmt::format("{} {} is writable by everyone (mode {:o})", what, path.string(),
                           st.st_mode & 07777);
      if (st.st_gid != group)
        return fmt::format("{} {} has group {}, not the cache directory's group {}", what,
                           path.string(), st.st_gid, group);
      return {};
  }
  return "unknown trust rule";
}

TrustRule::Kind trust_kind_for(bool read_only_layer) {
  const char* shared = std::getenv("FLASHJIT_CACHE_SHARED");
  if (shared != nullptr && std::string_view(shared) == "1") return TrustRule::Kind::group_shared;
  return read_only_layer ? TrustRule::Kind::read_only_layer : TrustRule::Kind::private_to_user;
}

DirectoryState check_directory(const fs::path& dir, TrustRule::Kind kind, bool create) {
  DirectoryState state;
  state.rule.kind = kind;
  struct stat st {};
  if (::stat(dir.c_str(), &st) != 0) {
    if (errno != ENOENT || !create) {
      state.why = fmt::format("{}: {}", dir.string(), errno_text(errno));
      return state;
    }
    if (std::string error = make_private_directories(dir); !error.empty()) {
      state.why = error;
      return state;
    }
    if (::stat(dir.c_str(), &st) != 0) {
      state.why = fmt::format("{}: {}", dir.string(), errno_text(errno));
      return state;
    }
  }
  if (!S_ISDIR(st.st_mode)) {
    state.why = fmt::format("{} is not a directory", dir.string());
    return state;
  }
  if (kind == TrustRule::Kind::group_shared) {
    state.rule.group = st.st_gid;
    if (!in_my_groups(st.st_gid)) {
      state.why = fmt::format("shared cache directory {} has group {}, which this user is not in",
                              dir.string(), st.st_gid);
      return state;
    }
  }
  state.why = state.rule.violation(st, dir);
  state.usable = state.why.empty();
  state.writable = state.usable && ::access(dir.c_str(), W_OK | X_OK) == 0;
  return state;
}

ReadResult read_trusted(const fs::path& path, const TrustRule& rule, std::size_t max_bytes) {
  ReadResult result;
  // O_NONBLOCK: opening a FIFO returns at once (and fstat refuses it) instead of waiting.
  const int fd = ::open(path.c_str(), O_RDONLY | O_NOFOLLOW | O_NONBLOCK | O_CLOEXEC);
  if (fd < 0) {
    result.absent = errno == ENOENT;
    result.why = errno == ELOOP
                     ? fmt::format("{} is a symbolic link", path.string())
                     : fmt::format("cannot open {}: {}", path.string(), errno_text(errno));
    return result;
  }
  struct Close {
    int fd;
    ~Close() { ::close(fd); }
  } close_at_exit{fd};
  struct stat st {};
  if (::fstat(fd, &st) != 0) {
    result.why = fmt::format("cannot stat {}: {}", path.string(), errno_text(errno));
    return result;
  }
  if (!S_ISREG(st.st_mode)) {
    result.why = fmt::format("{} is not a regular file", path.string());
    return result;
  }
  if (std::string why = rule.violation(st, path); !why.empty()) {
    result.why = why;
    return result;
  }
  if (static_cast<std::uint64_t>(st.st_size) > max_bytes) {
    result.why = fmt::format("{} has {} bytes: more than the {} an entry may have", path.string(),
                             st.st_size, max_bytes);
    return result;
  }
  std::string bytes(static_cast<std::size_t>(st.st_size), '\0');
  std::size_t done = 0;
  while (done < bytes.size()) {
    const ssize_t got = ::read(fd, bytes.data() + done, bytes.size() - done);
    if (got < 0 && errno == EINTR) continue;
    if (got <= 0) break;
    done += static_cast<std::size_t>(got);
  }
  if (done != bytes.size()) {
    result.why = fmt::format("{} changed size while being read", path.string());
    return result;
  }
  result.bytes = std::move(bytes);
  return result;
}

std::string write_temp(const fs::path& target, const std::string& bytes, fs::path& temp) {
  static std::atomic<unsigned> counter{0};
  static const unsigned long long salt = std::random_device{}();
  temp =
      target.parent_path() / fmt::format("{}{}.{}.{:x}.{}", kTempPrefix, target.filename().string(),
                                         ::getpid(), salt, counter++);
  const int fd = ::open(temp.c_str(), O_WRONLY | O_CREAT | O_EXCL | O_NOFOLLOW | O_CLOEXEC, 0644);
  if (fd < 0) return fmt::format("cannot create {}: {}", temp.string(), errno_text(errno));
  const char* data = bytes.data();
  std::size_t left = bytes.size();
  std::string error;
  while (left > 0 && error.empty()) {
    const ssize_t written = ::write(fd, data, left);
    if (written < 0 && errno == EINTR) continue;
    if (written <= 0) {
      error = fmt::format("cannot write {}: {}", temp.string(), errno_text(errno));
    } else {
      data += written;
      left -= static_cast<std::size_t>(written);
    }
  }
  if (error.empty() && ::fsync(fd) != 0)
    error = fmt::format("cannot fsync {}: {}", temp.string(), errno_text(errno));
  if (::close(fd) != 0 && error.empty())
    error = fmt::format("cannot close {}: {}", temp.string(), errno_text(errno));
  if (!error.empty()) ::unlink(temp.c_str());
  return error;
}

std::string replace_atomically(const fs::path& target, const std::string& bytes) {
  fs::path temp;
  std::string error = write_temp(target, bytes, temp);
  if (error.empty() && ::rename(temp.c_str(), target.c_str()) != 0) {
    error = fmt::format("cannot rename into {}: {}", target.string(), errno_text(errno));
    ::unlink(temp.c_str());
  }
  return error;
}

bool is_cache_temp_name(const std::string& name) {
  static const std::regex pattern(R"(\.tmp\..+\.(cubin|json)\.[0-9]+\.[0-9a-f]+\.[0-9]+)");
  return std::regex_match(name, pattern);
}

}  // namespace flashjit::detail

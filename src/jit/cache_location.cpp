#include "jit/cache_location.hpp"

#include <pwd.h>
#include <unistd.h>

#include <cstdlib>
#include <string_view>
#include <vector>

namespace flashjit::detail {
namespace fs = std::filesystem;

namespace {

const char* env(const char* name) {
  const char* value = std::getenv(name);
  return value != nullptr && *value != '\0' ? value : nullptr;
}

std::vector<fs::path> split_path_list(std::string_view list) {
  std::vector<fs::path> dirs;
  std::size_t start = 0;
  while (start <= list.size()) {
    const std::size_t end = std::min(list.find(':', start), list.size());
    if (end > start) dirs.emplace_back(std::string(list.substr(start, end - start)));
    start = end + 1;
  }
  return dirs;
}

// The home directory of the effective user from the password database (HOME may be unset under
// services and cron).
std::optional<fs::path> passwd_home() {
  long size = ::sysconf(_SC_GETPW_R_SIZE_MAX);
  std::vector<char> buffer(static_cast<std::size_t>(size > 0 ? size : 16384));
  passwd entry{};
  passwd* found = nullptr;
  if (::getpwuid_r(::geteuid(), &entry, buffer.data(), buffer.size(), &found) != 0 ||
      found == nullptr || found->pw_dir == nullptr || found->pw_dir[0] != '/')
    return std::nullopt;
  return fs::path(found->pw_dir);
}

}  // namespace

CacheLocation resolve_cache_location(const CacheOptions& options) {
  CacheLocation location;
  std::vector<fs::path> path_list;
  if (const char* list = env("FLASHJIT_CACHE_PATH")) path_list = split_path_list(list);

  if (options.dir) {
    location.writable = *options.dir;
    location.writable_source = "the cache directory given (--cache-dir / CacheOptions::dir)";
  } else if (!path_list.empty()) {
    location.writable = path_list.front();
    location.writable_source = "the first entry of FLASHJIT_CACHE_PATH";
  } else if (const char* dir = env("FLASHJIT_CACHE_DIR")) {
    location.writable = dir;
    location.writable_source = "FLASHJIT_CACHE_DIR";
  } else if (const char* xdg = env("XDG_CACHE_HOME")) {
    location.writable = fs::path(xdg) / "flashjit";
    location.writable_source = "XDG_CACHE_HOME";
  } else if (const char* home = env("HOME")) {
    location.writable = fs::path(home) / ".cache" / "flashjit";
    location.writable_source = "HOME";
  } else if (auto home_from_passwd = passwd_home()) {
    location.writable = *home_from_passwd / ".cache" / "flashjit";
    location.writable_source = "the passwd entry's home (HOME is unset)";
  } else {
    location.why_none =
        "HOME is unset and the user has no home in the password database; set "
        "FLASHJIT_CACHE_DIR to keep compiled kernels on disk";
  }

  location.read_only = options.read_only_dirs;
  for (std::size_t i = 1; i < path_list.size(); ++i) location.read_only.push_back(path_list[i]);
  if (options.dir && !path_list.empty())  // CacheOptions::dir took the writable place
    location.read_only.push_back(path_list.front());
  return location;
}

}  // namespace flashjit::detail

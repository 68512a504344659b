// A fresh directory under the system temp dir, removed with its contents at scope exit: private
// caches for tests and for `flashjit bench`'s cold-compile measurement.
#pragma once

#include <cstdlib>
#include <filesystem>
#include <string>
#include <string_view>

#include "flashjit/flashjit.hpp"

namespace flashjit::test {

class TempDir {
 public:
  explicit TempDir(std::string_view prefix = "flashjit-test") {
    std::string pattern =
        (std::filesystem::temp_directory_path() / (std::string(prefix) + "-XXXXXX")).string();
    if (::mkdtemp(pattern.data()) == nullptr)
      throw Error(ErrorCode::cache_error, "cannot create a temporary directory from " + pattern);
    path_ = pattern;
  }
  ~TempDir() {
    std::error_code ignored;
    std::filesystem::remove_all(path_, ignored);
  }
  TempDir(const TempDir&) = delete;
  TempDir& operator=(const TempDir&) = delete;
  const std::filesystem::path& path() const { return path_; }

 private:
  std::filesystem::path path_;
};

}  // namespace flashjit::test

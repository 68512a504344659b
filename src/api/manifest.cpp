#include "api/manifest.hpp"

#include <fcntl.h>
#include <fmt/format.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <fstream>
#include <sstream>
#include <algorithm>

#include "flashjit/flashjit.hpp"
#include "jit/trusted_files.hpp"

namespace flashjit::detail {
namespace {
constexpr const char* kHeader =
    "# flashjit variant manifest: one variant name per line ('flashjit precompile --manifest')\n";
}

std::string append_manifest_line(const std::filesystem::path& file, const std::string& name) {
  const int fd = ::open(file.c_str(), O_WRONLY | O_APPEND | O_CREAT | O_NOFOLLOW | O_CLOEXEC, 0644);
  if (fd < 0) return fmt::format("cannot open {}: {}", file.string(), std::strerror(errno));
  struct stat st {};
  std::string text = name + "\n";
  if (::fstat(fd, &st) == 0 && st.st_size == 0) text = kHeader + text;
  const ssize_t written = ::write(fd, text.data(), text.size());
  const int write_errno = errno;
  ::close(fd);
  if (written != static_cast<ssize_t>(text.size()))
    return fmt::format("cannot append to {}: {}", file.string(), std::strerror(write_errno));
  return {};
}

}  // namespace flashjit::detail

namespace flashjit {

std::vector<Variant> read_variant_manifest(const std::filesystem::path& file) {
  std::ifstream in(file);
  if (!in)
    throw Error(ErrorCode::invalid_argument,
                fmt::format("manifest {} cannot be read: {}", file.string(), std::strerror(errno)));
  std::vector<Variant> variants;
  std::string line;
  for (int number = 1; std::getline(in, line); ++number) {
    while (!line.empty() && (line.back() == '\r' || line.back() == ' ')) line.pop_back();
    if (line.empty() || line.front() == '#') continue;
    try {
      Variant variant = Variant::parse(line);
      if (std::find(variants.begin(), variants.end(), variant) == variants.end())
        variants.push_back(std::move(variant));
    } catch (const Error& e) {
      throw Error(ErrorCode::invalid_argument,
                  fmt::format("manifest {} line {}: {}", file.string(), number, e.what()));
    }
  }
  return variants;
}

void write_variant_manifest(const std::filesystem::path& file,
                            const std::vector<Variant>& variants) {
  std::string text = detail::kHeader;
  for (const Variant& variant : variants) text += variant.name() + "\n";
  if (std::string error = detail::replace_atomically(file, text); !error.empty())
    throw Error(ErrorCode::cache_error, error);
}

}  // namespace flashjit

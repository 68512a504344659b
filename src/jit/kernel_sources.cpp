#include "jit/kernel_sources.hpp"

#include <fmt/format.h>

#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <regex>
#include <set>
#include <sstream>

#include "flashjit/flashjit.hpp"

namespace flashjit::detail {
namespace {

std::string read_source(const std::string& path) {
  if (const char* dir = std::getenv("FLASHJIT_KERNELS_DIR"); dir != nullptr && *dir != '\0') {
    std::ifstream file(std::filesystem::path(dir) / path, std::ios::binary);
    if (!file)
      throw Error(ErrorCode::compile_failed,
                  fmt::format("kernel source {} not found in FLASHJIT_KERNELS_DIR={}", path, dir));
    std::ostringstream text;
    text << file.rdbuf();
    return text.str();
  }
  for (const SourceFile& file : embedded_kernel_files())
    if (file.path == path) return file.text;
  throw Error(ErrorCode::compile_failed,
              fmt::format("kernel source {} is not embedded in this flashjit", path));
}

}  // namespace

std::vector<SourceFile> kernel_translation_unit(const std::string& main_file) {
  static const std::regex include_line(R"re(^\s*#\s*include\s*"([^"]+)")re");
  std::vector<SourceFile> files;
  std::set<std::string> seen;
  std::vector<std::string> pending = {main_file};
  while (!pending.empty()) {
    std::string path = pending.back();
    pending.pop_back();
    if (!seen.insert(path).second) continue;
    std::string text = read_source(path);
    std::istringstream lines(text);
    for (std::string line; std::getline(lines, line);) {
      std::smatch match;
      if (std::regex_search(line, match, include_line)) pending.push_back(match[1]);
    }
    files.push_back({path, std::move(text)});
  }
  return files;
}

}  // namespace flashjit::detail

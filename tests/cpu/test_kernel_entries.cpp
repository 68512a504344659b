// Every kernel waits for the stream's previous grid before anything else
// (common/grid_dependency.cuh): the host launches all of them with programmatic stream
// serialization from sm_90 on, so a kernel that read or wrote memory before the wait could race
// with the kernel before it.
#include <doctest/doctest.h>

#include <cctype>
#include <string>
#include <vector>

#include "jit/kernel_sources.hpp"

namespace {

// The text after `from` with whitespace and comments skipped.
std::size_t skip_blank(const std::string& text, std::size_t from) {
  while (from < text.size()) {
    if (std::isspace(static_cast<unsigned char>(text[from]))) {
      ++from;
    } else if (text.compare(from, 2, "//") == 0) {
      from = text.find('\n', from);
      if (from == std::string::npos) return text.size();
    } else if (text.compare(from, 2, "/*") == 0) {
      from = text.find("*/", from);
      if (from == std::string::npos) return text.size();
      from += 2;
    } else {
      break;
    }
  }
  return from;
}

// The index just past the `{` that opens the body of the function declared at `from`: the first
// brace after the parameter list's closing parenthesis at depth 0 (launch bounds and template
// arguments hold parentheses and braces of their own).
std::size_t body_start(const std::string& text, std::size_t from) {
  int depth = 0;
  bool closed_parameters = false;
  for (std::size_t i = from; i < text.size(); ++i) {
    const char c = text[i];
    if (c == '(') {
      ++depth;
      closed_parameters = false;
    } else if (c == ')') {
      if (--depth == 0) closed_parameters = true;
    } else if (c == '{' && depth == 0 && closed_parameters) {
      return i + 1;
    } else if (!std::isspace(static_cast<unsigned char>(c)) && depth == 0) {
      closed_parameters = false;
    }
  }
  return std::string::npos;
}

struct Entry {
  std::string file;
  std::string first_statement;  // up to its semicolon
};

std::vector<Entry> kernel_entries(const std::vector<flashjit::detail::SourceFile>& files) {
  std::vector<Entry> entries;
  for (const auto& file : files) {
    for (std::size_t at = file.text.find("__global__"); at != std::string::npos;
         at = file.text.find("__global__", at + 1)) {
      const std::size_t body = body_start(file.text, at);
      REQUIRE_MESSAGE(body != std::string::npos, file.path << ": a __global__ without a body");
      const std::size_t first = skip_blank(file.text, body);
      const std::size_t end = file.text.find(';', first);
      entries.push_back({file.path, file.text.substr(first, end == std::string::npos
                                                                ? std::string::npos
                                                                : end + 1 - first)});
    }
  }
  return entries;
}

}  // namespace

TEST_CASE("every kernel begins by waiting for the stream's previous grid") {
  const std::vector<Entry> entries = kernel_entries(flashjit::detail::embedded_kernel_files());
  // forward (simt, mma, wgmma, decode), merge, block-mask builders (2), backward (bwd_mma and
  // its dQ kernel, bwd_wgmma and its dQ kernel, bwd_rows' three)
  CHECK(entries.size() >= 14);
  for (const Entry& entry : entries) {
    INFO(entry.file);
    CHECK(entry.first_statement == "begin_after_previous_grid();");
  }
}

TEST_CASE("the entry check sees a kernel that does something first") {
  const std::vector<flashjit::detail::SourceFile> files = {
      {"waits.cu",
       "template <int N>\n__global__ void __launch_bounds__(Shape{N, 2}.threads(), 1)\n"
       "    k(const P p) {\n  // why\n  begin_after_previous_grid();\n  x();\n}\n"},
      {"reads_first.cu",
       "__global__ void __launch_bounds__(128) k(const P p) {\n  const int a = p.a[0];\n"
       "  begin_after_previous_grid();\n}\n"}};
  const std::vector<Entry> entries = kernel_entries(files);
  REQUIRE(entries.size() == 2);
  CHECK(entries[0].first_statement == "begin_after_previous_grid();");
  CHECK(entries[1].first_statement == "const int a = p.a[0];");
}

// Plain-text output helpers: byte sizes for people, and aligned tables.
#pragma once

#include <cstdint>
#include <cstdio>
#include <string>
#include <vector>

namespace flashjit::cli {

// 1536 -> "1.5 KiB"; exact bytes below 1 KiB.
std::string human_bytes(std::uint64_t bytes);

// Columns sized to their widest cell; numbers right-aligned, text left-aligned.
class Table {
 public:
  enum class Align { left, right };
  struct Column {
    std::string header;
    Align align = Align::left;
  };

  explicit Table(std::vector<Column> columns);
  void add_row(std::vector<std::string> cells);
  bool empty() const { return rows_.empty(); }
  void print(std::FILE* out = stdout) const;

 private:
  std::vector<Column> columns_;
  std::vector<std::vector<std::string>> rows_;
};

}  // namespace flashjit::cli

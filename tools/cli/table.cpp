#include "table.hpp"

#include <fmt/format.h>

#include <algorithm>
#include <stdexcept>

namespace flashjit::cli {

std::string human_bytes(std::uint64_t bytes) {
  constexpr const char* kUnits[] = {"KiB", "MiB", "GiB", "TiB"};
  if (bytes < 1024) return fmt::format("{} B", bytes);
  double value = static_cast<double>(bytes);
  int unit = -1;
  while (value >= 1024 && unit < 3) {
    value /= 1024;
    ++unit;
  }
  return fmt::format("{:.1f} {}", value, kUnits[unit]);
}

Table::Table(std::vector<Column> columns) : columns_(std::move(columns)) {}

void Table::add_row(std::vector<std::string> cells) {
  if (cells.size() != columns_.size())
    throw std::logic_error(
        fmt::format("table row has {} cells for {} columns", cells.size(), columns_.size()));
  rows_.push_back(std::move(cells));
}

void Table::print(std::FILE* out) const {
  std::vector<size_t> widths;
  for (const Column& column : columns_) widths.push_back(column.header.size());
  for (const auto& row : rows_)
    for (size_t i = 0; i < row.size(); ++i) widths[i] = std::max(widths[i], row[i].size());

  auto print_row = [&](auto cell_text) {
    std::string line;
    for (size_t i = 0; i < columns_.size(); ++i) {
      const std::string& text = cell_text(i);
      const bool last = i + 1 == columns_.size();
      if (columns_[i].align == Align::right)
        line += fmt::format("{:>{}}", text, widths[i]);
      else if (last)
        line += text;  // no trailing blanks
      else
        line += fmt::format("{:<{}}", text, widths[i]);
      if (!last) line += "  ";
    }
    fmt::print(out, "{}\n", line);
  };
  print_row([&](size_t i) -> const std::string& { return columns_[i].header; });
  for (const auto& row : rows_) print_row([&](size_t i) -> const std::string& { return row[i]; });
}

}  // namespace flashjit::cli

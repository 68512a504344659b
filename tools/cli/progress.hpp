// A one-line progress bar on a terminal; elsewhere (pipes, files, -q) it draws nothing, so the
// per-item lines the commands print stay clean for logs and scripts.
#pragma once

#include <chrono>
#include <cstddef>
#include <string>
#include <string_view>

namespace flashjit::cli {

bool stdout_is_terminal();

class ProgressBar {
 public:
  ProgressBar(std::string label, std::size_t total, bool enabled);
  ~ProgressBar();
  ProgressBar(const ProgressBar&) = delete;
  ProgressBar& operator=(const ProgressBar&) = delete;

  bool enabled() const { return enabled_; }
  // One more item done; `detail` (e.g. its name) is shown after the count.
  void advance(std::string_view detail = {});
  // Prints a whole line to stdout, above the bar when one is drawn.
  void print_line(std::string_view line);
  // Erases the bar; later output starts on a clean line.
  void finish();

 private:
  void draw();

  std::string label_;
  std::size_t total_ = 0;
  std::size_t done_ = 0;
  std::string detail_;
  bool enabled_ = false;
  bool drawn_ = false;
  std::chrono::steady_clock::time_point start_;
};

}  // namespace flashjit::cli

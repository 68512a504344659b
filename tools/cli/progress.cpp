#include "progress.hpp"

#include <fmt/format.h>
#include <sys/ioctl.h>
#include <unistd.h>

#include <algorithm>
#include <cstdio>

namespace flashjit::cli {
namespace {

constexpr std::string_view kEraseLine = "\r\x1b[K";

int terminal_width() {
  winsize size{};
  if (ioctl(STDOUT_FILENO, TIOCGWINSZ, &size) == 0 && size.ws_col > 0) return size.ws_col;
  return 80;
}

}  // namespace

bool stdout_is_terminal() { return isatty(STDOUT_FILENO) == 1; }

ProgressBar::ProgressBar(std::string label, std::size_t total, bool enabled)
    : label_(std::move(label)),
      total_(total),
      enabled_(enabled && total > 0),
      start_(std::chrono::steady_clock::now()) {
  if (enabled_) draw();
}

ProgressBar::~ProgressBar() { finish(); }

void ProgressBar::advance(std::string_view detail) {
  ++done_;
  detail_ = detail;
  if (enabled_) draw();
}

void ProgressBar::print_line(std::string_view line) {
  if (drawn_) fmt::print("{}", kEraseLine);
  fmt::print("{}\n", line);
  if (enabled_ && done_ < total_)
    draw();
  else
    std::fflush(stdout);
}

void ProgressBar::finish() {
  if (!drawn_) return;
  fmt::print("{}", kEraseLine);
  std::fflush(stdout);
  drawn_ = false;
}

void ProgressBar::draw() {
  constexpr int kBarWidth = 30;
  const int filled = static_cast<int>(kBarWidth * done_ / std::max<std::size_t>(total_, 1));
  const double seconds =
      std::chrono::duration<double>(std::chrono::steady_clock::now() - start_).count();
  std::string line =
      fmt::format("{} [{}{}] {}/{} {:.1f}s {}", label_, std::string(filled, '#'),
                  std::string(kBarWidth - filled, '.'), done_, total_, seconds, detail_);
  // A wrapped bar cannot be erased with \r, so it never reaches the last column.
  line.resize(std::min<std::size_t>(line.size(), static_cast<std::size_t>(terminal_width() - 1)));
  fmt::print("{}{}", kEraseLine, line);
  std::fflush(stdout);
  drawn_ = true;
}

}  // namespace flashjit::cli

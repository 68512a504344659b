#include "core/log.hpp"

#include <spdlog/sinks/stdout_color_sinks.h>

#include <cctype>
#include <cstdlib>
#include <optional>
#include <string>

#include "flashjit/flashjit.hpp"

namespace flashjit::detail {

namespace {

constexpr const char* kLevelNames = "trace, debug, info, warn, error or off";

// The level a name means, in any case ("WARN" is warn); nullopt for a name that is none.
std::optional<spdlog::level::level_enum> parse_level(std::string_view name) {
  std::string lower(name);
  for (char& c : lower) c = static_cast<char>(std::tolower(static_cast<unsigned char>(c)));
  if (lower == "warning") lower = "warn";
  const auto level = spdlog::level::from_str(lower);
  // from_str answers "off" for any name it does not know; only "off" itself may mean off.
  if (level == spdlog::level::off && lower != "off") return std::nullopt;
  return level;
}

}  // namespace

spdlog::logger& log() {
  static std::shared_ptr<spdlog::logger> logger = [] {
    // Not in spdlog's global registry: the application may use spdlog too (or load a second
    // copy of flashjit), and a registered name taken twice throws.
    auto made = std::make_shared<spdlog::logger>(
        "flashjit", std::make_shared<spdlog::sinks::stderr_color_sink_mt>());
    made->set_pattern("[flashjit] [%l] %v");
    made->set_level(spdlog::level::warn);
    if (const char* name = std::getenv("FLASHJIT_LOG_LEVEL"); name != nullptr && *name != '\0') {
      if (auto level = parse_level(name))
        made->set_level(*level);
      else
        made->warn("FLASHJIT_LOG_LEVEL='{}' is unknown: expected {}; logging at warn", name,
                   kLevelNames);
    }
    return made;
  }();
  return *logger;
}

namespace {
// Made when the library loads, so a bad FLASHJIT_LOG_LEVEL is reported even by a process that
// never logs anything else.
[[maybe_unused]] const bool logger_made_at_load = (log(), true);
}  // namespace

}  // namespace flashjit::detail

namespace flashjit {

void set_log_level(std::string_view level) {
  const auto parsed = detail::parse_level(level);
  if (!parsed)
    throw Error(ErrorCode::invalid_argument,
                fmt::format("log level '{}' is unknown: expected {}", level, detail::kLevelNames));
  detail::log().set_level(*parsed);
}

}  // namespace flashjit

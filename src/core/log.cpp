#include "core/log.hpp"

#include <spdlog/sinks/stdout_color_sinks.h>

#include <cstdlib>
#include <string>

#include "flashjit/flashjit.hpp"

namespace flashjit::detail {

spdlog::logger& log() {
  static std::shared_ptr<spdlog::logger> logger = [] {
    // Not in spdlog's global registry: the application may use spdlog too (or load a second
    // copy of flashjit), and a registered name taken twice throws.
    auto made = std::make_shared<spdlog::logger>(
        "flashjit", std::make_shared<spdlog::sinks::stderr_color_sink_mt>());
    made->set_pattern("[flashjit] [%l] %v");
    const char* level = std::getenv("FLASHJIT_LOG_LEVEL");
    made->set_level(level ? spdlog::level::from_str(level) : spdlog::level::warn);
    return made;
  }();
  return *logger;
}

}  // namespace flashjit::detail

namespace flashjit {

void set_log_level(std::string_view level) {
  const auto parsed = spdlog::level::from_str(std::string(level));
  // from_str answers "off" for any name it does not know; only "off" itself may mean off.
  if (parsed == spdlog::level::off && level != "off")
    throw Error(ErrorCode::invalid_argument,
                fmt::format("log level '{}' is unknown: expected trace, debug, info, warn, error "
                            "or off",
                            level));
  detail::log().set_level(parsed);
}

}  // namespace flashjit

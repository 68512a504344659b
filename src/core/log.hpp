// The library's logger ("flashjit"); level from FLASHJIT_LOG_LEVEL (trace..off, default warn).
#pragma once

#include <spdlog/spdlog.h>

namespace flashjit::detail {
spdlog::logger& log();
}

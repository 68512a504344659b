// The resources a command works on: the library's log level, the kernel cache and the GPU engine.
#include <fmt/format.h>

#include <cstdlib>

#include "cli.hpp"

namespace flashjit::cli {

void apply_log_level(const GlobalOptions& globals) {
  const char* level = nullptr;
  if (globals.quiet)
    level = "error";
  else if (globals.verbosity == 1)
    level = "info";
  else if (globals.verbosity >= 2)
    level = "debug";
  if (level != nullptr) set_log_level(level);
}

std::shared_ptr<KernelCache> open_cache(const GlobalOptions& globals, bool need_disk) {
  auto cache = std::make_shared<KernelCache>(CacheOptions{globals.cache_dir});
  if (need_disk && !cache->directory()) {
    const std::string which =
        globals.cache_dir ? fmt::format("the cache directory {}", globals.cache_dir->string())
                          : std::string(
                                "the default cache directory ($FLASHJIT_CACHE_DIR, "
                                "$XDG_CACHE_HOME/flashjit or ~/.cache/flashjit)");
    throw Error(ErrorCode::cache_error,
                fmt::format("{} cannot be created or written: pass --cache-dir DIR with a "
                            "writable directory",
                            which));
  }
  return cache;
}

std::string describe_cache_location(const KernelCache& cache) {
  if (auto dir = cache.directory()) return dir->string();
  return "(none: the cache directory is not usable, kernels are kept in memory only)";
}

std::unique_ptr<Engine> open_engine(std::string_view command, int device,
                                    std::shared_ptr<KernelCache> cache) {
  try {
    return std::make_unique<Engine>(device, std::move(cache));
  } catch (const Error& e) {
    if (e.code() != ErrorCode::no_driver && e.code() != ErrorCode::no_device) throw;
    throw Error(e.code(), fmt::format("`flashjit {}` runs on a GPU, and there is none here: {}",
                                      command, e.what()));
  }
}

}  // namespace flashjit::cli

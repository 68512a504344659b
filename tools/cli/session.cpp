// The resources a command works on: the library's log level, the kernel cache and the GPU engine.
#include <fmt/format.h>
#include <fmt/ranges.h>

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
  auto cache = std::make_shared<KernelCache>(CacheOptions{globals.cache_dir, {}});
  if (need_disk && !cache->directory())
    throw Error(ErrorCode::cache_error,
                fmt::format("{}: pass --cache-dir DIR with a directory of yours that only you "
                            "can write",
                            cache->why_not_persistent()));
  return cache;
}

std::string describe_cache_location(const KernelCache& cache) {
  std::vector<std::string> layers;
  for (const CacheLayer& layer : cache.layers())
    layers.push_back(
        fmt::format("{} ({})", layer.dir.string(), layer.writable ? "writable" : "read-only"));
  if (cache.directory()) return fmt::format("{}", fmt::join(layers, " + "));
  return fmt::format("(no writable directory: {}; new kernels are kept in memory only){}",
                     cache.why_not_persistent(),
                     layers.empty() ? "" : fmt::format(" + {}", fmt::join(layers, " + ")));
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

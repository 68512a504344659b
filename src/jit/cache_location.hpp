// Where the disk cache lives: the writable directory and the read-only layers after it, each with
// where the choice came from (for messages). Never a shared temp directory.
#pragma once

#include <filesystem>
#include <optional>
#include <string>
#include <vector>

#include "flashjit/flashjit.hpp"

namespace flashjit::detail {

struct CacheLocation {
  // The writable layer: CacheOptions::dir, else the first entry of $FLASHJIT_CACHE_PATH, else
  // $FLASHJIT_CACHE_DIR, $XDG_CACHE_HOME/flashjit, $HOME/.cache/flashjit, then the passwd
  // entry's home. nullopt when none can be found (memory-only); `why_none` says so.
  std::optional<std::filesystem::path> writable;
  std::string writable_source;  // e.g. "FLASHJIT_CACHE_DIR", "the passwd entry's home"
  std::string why_none;
  // Read-only layers, searched after the writable one: CacheOptions::read_only_dirs, then the
  // other entries of $FLASHJIT_CACHE_PATH.
  std::vector<std::filesystem::path> read_only;
};

CacheLocation resolve_cache_location(const CacheOptions& options);

}  // namespace flashjit::detail

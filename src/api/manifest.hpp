// Variant manifests: the file format shared by usage recording (FLASHJIT_RECORD,
// Engine::record_variants), `flashjit precompile --manifest` and the bundles of
// `flashjit precompile --out`. One canonical variant name per line; blank lines and lines that
// start with '#' are ignored.
#pragma once

#include <filesystem>
#include <string>

namespace flashjit::detail {
// Appends `name` as one line (one write with O_APPEND, so processes recording into the same file
// never interleave a line); a new file gets a comment line first. Returns an error message.
std::string append_manifest_line(const std::filesystem::path& file, const std::string& name);
}  // namespace flashjit::detail

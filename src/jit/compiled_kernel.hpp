// The one record of a compiled kernel: what `flashjit list` shows (CacheEntry), plus what loading
// and verifying it needs. The disk cache's metadata is this record as JSON, without the cubin.
#pragma once

#include <optional>
#include <string>
#include <string_view>

#include "flashjit/flashjit.hpp"

namespace flashjit::detail {

struct CompiledKernel {
  CacheEntry entry;          // variant, key prefix, sizes, registers, versions, times
  std::string key;           // the whole content key: 32 hex digits (see content_key.hpp)
  std::string lowered_name;  // mangled entry point for cuModuleGetFunction
  // The entry that reads a block mask (KernelSpec::block_mask_name_expression); empty: none.
  std::string block_mask_lowered_name;
  std::string log;           // NVRTC's log (ptxas -v)
  std::string cubin;         // empty in a record read from metadata alone
  std::string cubin_xxh3;    // hash of the cubin the record was written for
  std::string store_error;   // this process could not write it to the disk cache (why)

  // Whether `bytes` is the cubin this record was written for (size and XXH3 hash).
  bool describes(std::string_view bytes) const;
};

std::string cubin_hash(std::string_view cubin);

// The record as the JSON metadata of a disk cache entry (cubin_bytes and cubin_xxh3 of `cubin`).
std::string metadata_json(const CompiledKernel& kernel, std::string_view cubin);
// Reads metadata back. Malformed or foreign text gives nullopt and, when `why` is given, the
// reason; it never throws (the text comes from disk and may be anything).
std::optional<CompiledKernel> parse_metadata(std::string_view json_text, std::string* why);

}  // namespace flashjit::detail

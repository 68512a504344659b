// NVRTC: one Variant + its kernel sources -> CUBIN for the variant's exact arch, with the log and
// the resource usage ptxas reports (no GPU needed).
#pragma once

#include <string>
#include <vector>

#include "flashjit/flashjit.hpp"
#include "kernel_source.hpp"

namespace flashjit::detail {

struct CompiledKernel {
  Variant variant;
  std::string key;           // content key (32 hex digits), see kernel_cache.cpp
  std::string lowered_name;  // mangled entry point for cuModuleGetFunction
  std::string cubin;
  std::string log;
  int registers = 0;
  int spill_bytes = 0;
  int static_shared_bytes = 0;
  int dynamic_shared_bytes = 0;
  double compile_ms = 0;
  std::string created;
  std::string store_error;  // non-empty if it could not be written to the disk cache
};

std::vector<std::string> nvrtc_options(const Variant& variant);
// Throws Error(compile_failed) with the NVRTC log.
CompiledKernel compile_with_nvrtc(const Variant& variant, const std::vector<SourceFile>& unit);

}  // namespace flashjit::detail

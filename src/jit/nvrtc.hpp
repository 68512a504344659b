// NVRTC: one KernelSpec + its translation unit -> CUBIN for the spec's arch, with the log and the
// resource usage ptxas reports (no GPU needed).
#pragma once

#include <string>
#include <vector>

#include "flashjit/flashjit.hpp"
#include "jit/compiled_kernel.hpp"
#include "jit/kernel_sources.hpp"
#include "jit/kernel_spec.hpp"

namespace flashjit::detail {
// `variant` names the result (its CacheEntry); the spec alone decides what is compiled.
// Throws Error(compile_failed) with the NVRTC log.
CompiledKernel compile_with_nvrtc(const Variant& variant, const KernelSpec& spec,
                                  const std::vector<SourceFile>& unit);

// ptxas's notes that it serialized a kernel's wgmma instructions (each "(C75xx) Potential
// Performance Loss: wgmma..." of the log, code and reason, without the function name): such a
// kernel runs well below its speed. Empty when every wgmma stayed asynchronous.
std::vector<std::string> wgmma_serialization_notes(const std::string& log);
}  // namespace flashjit::detail

// Whether bytes are a CUDA ELF (cubin) built for an arch: checked before any cubin from disk is
// served, so a planted file of another kind or for another GPU is never loaded.
#pragma once

#include <string>
#include <string_view>

namespace flashjit::detail {
// Empty when `cubin` is a 64-bit CUDA ELF for `arch` ("sm_90a": SM 90), else what is wrong.
std::string cubin_mismatch(std::string_view cubin, std::string_view arch);
}  // namespace flashjit::detail

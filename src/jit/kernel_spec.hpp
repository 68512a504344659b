// What the JIT compiles: a plain description of one kernel, made by a family (src/families/) and
// understood without knowing any family.
#pragma once

#include <string>
#include <vector>

namespace flashjit::detail {

struct KernelSpec {
  std::string source_file;           // main file under kernels_src/, e.g. "wgmma/kernel.cu"
  std::string name_expression;       // "flashjit::fmha_wgmma_kernel<flashjit::bf16, 128, ...>"
  // The kernel's entry that reads a block mask (its BlockMask argument true), compiled beside it
  // where the variant's user functions have a mask_mod; empty for families without block masks.
  std::string block_mask_name_expression;
  std::vector<std::string> options;  // NVRTC options, the target arch among them
  int dynamic_shared_bytes = 0;      // what its launches ask for; the module raises its limit
};

}  // namespace flashjit::detail

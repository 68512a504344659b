// Kernel sources: embedded at build time from kernels_src/, or read from $FLASHJIT_KERNELS_DIR.
#pragma once

#include <string>
#include <vector>

namespace flashjit::detail {

struct SourceFile {
  std::string path;  // relative to kernels_src/, e.g. "common/params.cuh"
  std::string text;
};

const std::vector<SourceFile>& embedded_kernel_files();  // generated

// The main file and every file it includes (transitively, `#include "..."` relative to
// kernels_src/), main file first. Throws Error(compile_failed) for a missing file.
std::vector<SourceFile> kernel_translation_unit(const std::string& main_file);

}  // namespace flashjit::detail

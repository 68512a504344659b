// Loaded modules per CUDA context: each (context, compiled kernel) is loaded once, even when many
// threads ask at the same moment; the kernel's dynamic shared-memory limit is raised at load.
#pragma once

#include <cuda.h>

#include <string>
#include <string_view>
#include <utility>

#include "core/once_map.hpp"

namespace flashjit::detail {

// A compiled kernel as the driver loads it.
struct ModuleImage {
  std::string_view key;  // identifies the binary (its content key)
  std::string_view cubin;
  std::string_view entry_point;  // the mangled name of the __global__ function
  int dynamic_shared_bytes = 0;  // the most its launches ask for
  std::string_view block_mask_entry_point = {};  // its entry that reads a block mask; empty: none
};

struct LoadedKernel {
  CUmodule module = nullptr;
  CUfunction function = nullptr;
  CUfunction block_mask_function = nullptr;  // null: the kernel has no block-mask entry
};

class ModuleCache {
 public:
  ModuleCache() = default;
  ~ModuleCache();
  ModuleCache(const ModuleCache&) = delete;
  ModuleCache& operator=(const ModuleCache&) = delete;

  // `context` must be current on the calling thread.
  LoadedKernel get(CUcontext context, const ModuleImage& image);

 private:
  OnceMap<std::pair<CUcontext, std::string>, LoadedKernel> loaded_;  // by content key
};

}  // namespace flashjit::detail

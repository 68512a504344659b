// The content key of a compiled kernel: a hash of everything the binary depends on, so an entry
// built from other sources, options or versions can never be served for this one.
#pragma once

#include <string>
#include <vector>

#include "jit/kernel_sources.hpp"

namespace flashjit::detail {

struct KeyInputs {
  std::string flashjit_version;
  std::string nvrtc_version;
  std::string variant_name;
  std::string name_expression;
  std::string block_mask_name_expression;
  std::vector<std::string> options;
  std::vector<SourceFile> sources;  // the translation unit: main file and its includes
};

// 32 hex digits of XXH3-128 over the inputs, each field separated so none can run into the next.
std::string content_key(const KeyInputs& inputs);

}  // namespace flashjit::detail

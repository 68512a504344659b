// Geometry of the block-mask builder (block_mask/kernel.cu), shared by NVRTC and g++.
#pragma once

namespace flashjit {

struct BlockMaskShape {
  static constexpr int kThreads = 256;  // one CTA per (query tile, head, batch) of the map
};

}  // namespace flashjit

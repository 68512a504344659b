// Geometry of the merge kernel (merge/kernel.cu): one warp per output row. Shared by NVRTC and g++.
#pragma once

namespace flashjit {

struct MergeShape {
  static constexpr int kWarps = 4;  // rows per CTA
  static constexpr int kThreads = kWarps * 32;
  static constexpr int kMaxStates = 128;  // what ForwardOptions::num_splits allows
};

}  // namespace flashjit

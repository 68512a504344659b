// Geometry of the backward pass's row kernels (bwd_rows/kernel.cu): one warp per query row. The
// rows each sequence and head keeps in the workspace: common/bwd_workspace.cuh. Read by NVRTC and
// g++ (src/families/bwd_rows).
#pragma once

namespace flashjit {

struct BwdRowsShape {
  static constexpr int kWarps = 8;  // rows per CTA
  static constexpr int kThreads = kWarps * 32;
};

}  // namespace flashjit

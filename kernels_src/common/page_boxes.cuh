// How the TMA boxes of a key tile fall on the pages of a paged KV cache. Plain C++ read by NVRTC
// (the decode and wgmma kernels) and by g++ (their hosts' tensor maps), so the maps' boxes are
// the boxes the kernels issue.
#pragma once

#include "common/host_device.cuh"

namespace flashjit {

// Keys per box: the largest power of two dividing both the page size and the tile's keys, so a
// box never crosses a page.
FLASHJIT_HOST_DEVICE constexpr int page_box_rows(int page_size, int tile_n) {
  const int low_bit = page_size & -page_size;
  return low_bit < tile_n ? low_bit : tile_n;
}

}  // namespace flashjit

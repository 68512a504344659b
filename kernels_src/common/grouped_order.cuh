// Work on `pairs` (batch, head) pairs of `tiles` tiles each, in groups of `group` pairs: within a
// group rank 0 of every pair, then rank 1, and so on. Where rank 0 is the costliest tile this
// deals the heaviest work first (a balanced tail), and the CTAs running at once work on one
// group's pairs, whose K/V (or Q and dO) then stay in L2. Plain C++ for NVRTC and g++.
#pragma once

#include "common/host_device.cuh"

namespace flashjit {

struct GroupedTile {
  int rank;  // within its pair: 0 first
  int pair;
};

FLASHJIT_HOST_DEVICE constexpr GroupedTile grouped_tile(int linear, int tiles, int pairs,
                                                        int group) {
  const int first = linear / (tiles * group) * group;  // the group's first pair
  const int within = linear - first * tiles;
  const int group_pairs = pairs - first < group ? pairs - first : group;  // the last may be short
  return {within / group_pairs, first + within % group_pairs};
}

}  // namespace flashjit

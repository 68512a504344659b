// Split-KV for one planned forward: how many splits, how many key tiles each, and the workspace
// the partials take (FmhaParams documents the layout), plus the merge that combines them.
#pragma once

#include <cstddef>

#include "core/problem.hpp"
#include "families/family.hpp"

namespace flashjit::detail {

struct SplitPlan {
  int num_splits = 1;
  int split_tiles = 0;  // key tiles per split (all of them when num_splits is 1)
  std::size_t workspace_bytes = 0;  // 0 when num_splits is 1
  std::size_t lse_offset = 0;       // where the partial LSEs start in the workspace
};

// The split plan of `variant` (of `family`) for the problem on this device; families without
// split-KV get num_splits 1.
SplitPlan plan_splits(const KernelFamily& family, const Variant& variant,
                      const ForwardProblem& problem, const DeviceInfo& device);

// Merge params that combine the partials `params` points at into its output and LSE.
MergeParams split_merge_params(const FmhaParams& params, int head_dim);

}  // namespace flashjit::detail

// Engine's state, shared by the files that implement its calls (engine.cpp: forward and the
// rest; backward.cpp: backward).
#pragma once

#include <atomic>
#include <cstdlib>
#include <future>
#include <map>
#include <mutex>
#include <set>
#include <tuple>
#include <string_view>
#include <vector>

#include "api/block_mask.hpp"
#include "api/dispatch.hpp"
#include "api/kernel_cache_impl.hpp"
#include "api/launch_plans.hpp"
#include "api/manifest.hpp"
#include "api/split_kv.hpp"
#include "api/validate.hpp"
#include "api/workspaces.hpp"
#include "core/log.hpp"
#include "cuda/context.hpp"
#include "cuda/device.hpp"
#include "cuda/driver.hpp"
#include "cuda/modules.hpp"
#include "families/block_mask/block_mask.hpp"
#include "families/merge/merge.hpp"
#include "families/registry.hpp"

#include "api/backward_kernels.hpp"

namespace flashjit {

// Hidden like everything internal (a nested class takes its enclosing class's visibility).
struct __attribute__((visibility("hidden"))) Engine::Impl {
  using MergeKernel = detail::KernelHandle;

  Impl(int ordinal, std::shared_ptr<KernelCache> shared_cache)
      : device(detail::query_device(ordinal)),
        primary(ordinal),
        cache(shared_cache ? std::move(shared_cache) : std::make_shared<KernelCache>()) {}

  // Everything a first forward of this key needs: the context's device checked, the variant
  // chosen, its kernel compiled or loaded, its module loaded in the context, its launch planned.
  std::shared_ptr<const detail::ReadyLaunch> prepare(const detail::PlanKey& key,
                                                     const detail::ForwardProblem& problem,
                                                     const std::optional<TileConfig>& tiles);

  // forward's work after validation: plan (first time for the key), launch, merge.
  void run(const detail::ForwardProblem& problem, const ForwardOptions& options,
           CUstream_st* stream);
  Variant selected(const detail::ForwardProblem& problem, const ForwardOptions& options) const;
  // The splits (and workspace) forward would use; one split for an empty problem.
  detail::SplitPlan split_plan(const detail::ForwardProblem& problem,
                               const ForwardOptions& options) const;

  // Builds the block mask of options' mask_mod for the problem (Engine::create_block_mask).
  BlockMask block_mask(const Engine& engine, const detail::ForwardProblem& problem,
                       const ForwardOptions& options, const BlockMaskOptions& mask_options,
                       CUstream_st* stream);

  // The same for a backward's (Engine::create_backward_block_mask, backward.cpp).
  BlockMask backward_block_mask(const Engine& engine, const detail::BackwardProblem& problem,
                                const BackwardOptions& options,
                                const BlockMaskOptions& mask_options, CUstream_st* stream);
  // Runs `builder` (a block-mask builder variant) over `map`'s entries, on `stream`.
  void build_map(const detail::LaunchContext& context, const Variant& builder,
                 const FmhaParams& params, const detail::BlockMaskData& map, CUstream_st* stream);

  // Throws Error(invalid_argument) unless the current context is on the engine's device.
  void check_context_device() const;
  // Backward's kernels for the problem, compiled (or loaded) and loaded in `context` the first
  // time for its key (backward.cpp).
  const detail::BackwardKernels& backward_kernels(CUcontext context,
                                                  const detail::BackwardProblem& problem,
                                                  const BackwardOptions& options);
  // A backward's kernels and launch plans, the first time for its key.
  std::shared_ptr<const detail::BackwardLaunch> prepare_backward(
      const detail::BackwardPlanKey& key, CUcontext context,
      const detail::BackwardProblem& problem, const BackwardOptions& options);
  // Engine::backward on a validated problem (equal-length or varlen).
  void backward(detail::BackwardProblem problem, const BackwardOptions& options,
                CUstream_st* stream);
  // `variant`'s kernel loaded in `context`.
  detail::KernelHandle load(CUcontext context, const Variant& variant);
  // A compiled kernel's module in `context` (loaded once), with its entries.
  detail::LoadedKernel loaded(CUcontext context, const detail::CompiledKernel& kernel);
  // The merge kernel for outputs of this dtype and head dim, loaded in `context`.
  MergeKernel merge_kernel(CUcontext context, DType dtype, int head_dim);
  // The problem's workspace: the caller's (checked against what the plan needs) or the engine's.
  void* workspace_for(const detail::ReadyLaunch& ready, const ForwardOptions& options,
                      CUcontext context, CUstream stream);

  // Appends the variant to the usage manifest, once per engine (the slow path only).
  void record(const Variant& variant);
  // The background compile of `variant` (started now unless one was already).
  std::shared_ptr<const detail::BackgroundCompile> compile_in_background(const Variant& variant);
  // The kernel for `preferred` if it needs no compile, else (never-block) a compiled stand-in
  // for the same problem while `preferred` compiles in the background; else compiles and waits.
  void choose_kernel(detail::ReadyLaunch& ready, const Variant& preferred,
                     const detail::ForwardProblem& problem, const detail::KernelFamily* forced,
                     bool tiles_forced);

  DeviceInfo device;
  detail::PrimaryContext primary;  // declared before modules: they unload while it is retained
  std::shared_ptr<KernelCache> cache;
  detail::ModuleCache modules;
  detail::LaunchPlans plans;
  detail::Workspaces workspaces{"split-KV workspace"};
  // Per stream: two ints for launches that take units (wgmma).
  detail::Workspaces tile_counters{"tile counters"};
  std::mutex merge_mutex;
  std::map<std::tuple<CUcontext, DType, int>, MergeKernel> merge_kernels;
  std::mutex backward_mutex;
  std::map<detail::BackwardKey, detail::BackwardKernels> backward_kernel_sets;
  detail::PlanMap<detail::BackwardPlanKey, detail::BackwardLaunch> backward_plans;
  std::mutex record_mutex;
  std::optional<std::filesystem::path> record_file;
  std::set<std::string> recorded;
  std::atomic<bool> never_block{false};
  std::mutex background_mutex;
  std::map<std::string, std::shared_ptr<detail::BackgroundCompile>> background;  // by variant
  std::vector<std::future<void>> compiles;  // last: destroyed first, waiting for each compile
};

}  // namespace flashjit

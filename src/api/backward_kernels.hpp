// What Engine::backward loads once per (context, dtype, head dim, mask, score variants, mode,
// forced family and tiles): its three kernels, and the dK/dV variant it reports (backward.cpp).
#pragma once

#include <cuda.h>

#include <array>
#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <tuple>

#include "api/launch_plans.hpp"
#include "api/validate_backward.hpp"
#include "cuda/device.hpp"
#include "cuda/launch.hpp"
#include "flashjit/flashjit.hpp"
#include "jit/compiled_kernel.hpp"

namespace flashjit::detail {

struct BackwardKernels {
  Variant dkdv;    // bwd_wgmma_fused, bwd_wgmma or bwd_mma (or the forced family), for the problem
  Variant finish;  // bwd_convert, or a dQ kernel (bwd_wgmma_dq, the deterministic bwd_mma_dq)
  bool dq_accumulator = false;  // uses_dq_accumulator(finish)
  bool dq_accumulator_blocks = false;  // dkdv's family's KernelFamily::dq_accumulator_blocks
  KernelHandle prep, main, last;
  KernelHandle sink;  // bwd_sink, where BackwardOptions::d_sink_logits is set
};

// (context, dtype, head_dim, causal, softcap, window, alibi, varlen, user functions' hash
// (user_functions_key), d_sink_logits set, deterministic, family, tiles). The sinks' gradient
// adds a kernel.
using BackwardKey = std::tuple<CUcontext, DType, int, bool, bool, bool, bool, bool,
                               std::array<std::uint64_t, 2>, bool, bool, std::string, int, int,
                               int>;
BackwardKey backward_key(CUcontext context, const BackwardProblem& problem,
                         const BackwardOptions& options);

// The hot path's key of a backward: the forward's (shapes, strides, score variants, tiles, the
// forced family) and what only a backward has (dO's strides, the mode, the sinks' gradient).
// dq, dk, dv and the workspace are plain pointers and strides of the params: no plan reads them.
struct BackwardPlanKey {
  PlanKey forward;
  std::array<std::int64_t, 3> dout_strides{};  // batch, seqlen, heads
  std::int32_t deterministic = 0, d_sink = 0;

  // forced: options.family's family (null: none named).
  static BackwardPlanKey of(CUcontext context, const BackwardProblem& problem,
                            const BackwardOptions& options, const KernelFamily* forced);
  bool operator==(const BackwardPlanKey&) const = default;
};

// A warm backward's launches: the kernels of its BackwardKey, each launch planned once (tensor
// maps at the first call's addresses, re-addressed per call like the forward's).
struct BackwardLaunch {
  const BackwardKernels* kernels = nullptr;  // Engine::Impl::backward_kernel_sets, never erased
  LaunchPlan prep;
  LaunchPlan sink;  // where the sinks' gradient is asked for
  LaunchPlan dkdv;
  LaunchPlan finish;  // bwd_convert's or the dQ kernel's
};

// The dK/dV variant for the problem on this GPU: options.family's (a dK/dV family that runs it,
// else Error(invalid_argument)), else the first registered that does; options.tiles replace the
// family's tile table, checked like any variant.
Variant select_backward_variant(const BackwardProblem& problem, const DeviceInfo& device,
                                const BackwardOptions& options);
// The kernel that computes or finishes dQ after it: bwd_convert after a family that always adds
// dQ up (bwd_wgmma_fused); bwd_wgmma's dQ kernel after bwd_wgmma (both modes: no atomics
// anywhere); after bwd_mma bwd_convert, or in the deterministic mode bwd_mma's dQ kernel.
Variant backward_finish_variant(const BackwardProblem& problem, const Variant& dkdv);
// Whether the workspace holds the fp32 dQ accumulator for kernels ending with `finish`: only
// bwd_convert reads one (the dK/dV kernel summed dQ there by atomics); a dQ kernel writes dq
// itself. BackwardProblem::dq_accumulator takes this, and with it the workspace's size.
bool uses_dq_accumulator(const Variant& finish);
// The launch of a backward kernel (its family's backward_plan, else plan).
LaunchPlan backward_launch_plan(const Variant& variant, const ForwardProblem& problem,
                                const BackwardParams& params, const DeviceInfo& device);

}  // namespace flashjit::detail

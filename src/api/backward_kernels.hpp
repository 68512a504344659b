// What Engine::backward loads once per (context, dtype, head dim, mask, mode, forced family and
// tiles): its three kernels, and the dK/dV variant it reports (backward.cpp).
#pragma once

#include <cuda.h>

#include <memory>
#include <optional>
#include <string>
#include <tuple>

#include "api/validate_backward.hpp"
#include "cuda/device.hpp"
#include "flashjit/flashjit.hpp"
#include "jit/compiled_kernel.hpp"

namespace flashjit::detail {

// A compiled kernel and its function in one context (the kernel owns what the function came
// from).
struct KernelHandle {
  std::shared_ptr<const CompiledKernel> kernel;
  CUfunction function = nullptr;
};

struct BackwardKernels {
  Variant dkdv;    // bwd_mma (or the forced family), chosen for the problem
  Variant finish;  // bwd_convert, or the deterministic mode's dQ kernel
  KernelHandle prep, main, last;
};

using BackwardKey = std::tuple<CUcontext, DType, int, bool, bool, std::string, int, int, int>;
BackwardKey backward_key(CUcontext context, const BackwardProblem& problem,
                         const BackwardOptions& options);

// The dK/dV variant for the problem on this GPU: options.family's (a dK/dV family that runs it,
// else Error(invalid_argument)), else the first registered that does; options.tiles replace the
// family's tile table, checked like any variant.
Variant select_backward_variant(const BackwardProblem& problem, const DeviceInfo& device,
                                const BackwardOptions& options);
// The kernel that finishes dQ after it: bwd_convert, or the deterministic mode's dQ kernel.
Variant backward_finish_variant(const BackwardProblem& problem, const Variant& dkdv);

}  // namespace flashjit::detail

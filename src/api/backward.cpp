// Engine::backward: validate -> (first time for this key: choose and load the kernels) -> on the
// caller's stream, bwd_prep (row terms, zeroed dQ accumulator), the dK/dV kernel (dQ by atomics),
// then bwd_convert (the accumulator to dq), or in the deterministic mode the dQ kernel.
#include <fmt/format.h>

#include "api/engine_impl.hpp"
#include "families/bwd_rows/bwd_rows.hpp"

namespace flashjit {

const detail::BackwardKernels& Engine::Impl::backward_kernels(
    CUcontext context, const detail::BackwardProblem& problem, const BackwardOptions& options) {
  const detail::BackwardKey key = detail::backward_key(context, problem, options);
  std::lock_guard lock(backward_mutex);
  if (auto found = backward_kernel_sets.find(key); found != backward_kernel_sets.end())
    return found->second;
  check_context_device();
  detail::BackwardKernels kernels;
  kernels.dkdv = detail::select_backward_variant(problem, device, options);
  kernels.finish = detail::backward_finish_variant(problem, kernels.dkdv);
  const Variant prep = detail::bwd_prep_variant(device.arch, problem.forward.dtype,
                                                problem.forward.head_dim);
  kernels.prep = load(context, prep);
  kernels.main = load(context, kernels.dkdv);
  kernels.last = load(context, kernels.finish);
  record(prep);
  record(kernels.dkdv);
  record(kernels.finish);
  return backward_kernel_sets.emplace(key, std::move(kernels)).first->second;
}

void Engine::backward(const TensorView& q, const TensorView& k, const TensorView& v,
                      const TensorView& out, const TensorView& dout, const float* lse,
                      const TensorView& dq, const TensorView& dk, const TensorView& dv,
                      const BackwardOptions& options, CUstream_st* stream) {
  const detail::BackwardProblem problem =
      detail::validate_backward(q, k, v, out, dout, lse, dq, dk, dv, options);
  const detail::ForwardProblem& forward = problem.forward;
  if (forward.batch == 0 || forward.heads_q == 0 || forward.seqlen_k == 0) return;
  const std::size_t bytes = problem.workspace_bytes();
  if (options.workspace != nullptr && options.workspace_bytes < bytes)
    throw Error(ErrorCode::invalid_argument,
                fmt::format("options.workspace_bytes is {}: expected at least {} "
                            "(Engine::backward_workspace_bytes for these arguments)",
                            options.workspace_bytes, bytes));
  const detail::LaunchContext context(stream, impl_->primary.get());
  const detail::BackwardKernels& kernels = impl_->backward_kernels(context.get(), problem, options);
  const detail::KernelFamily& dkdv = detail::family_named(kernels.dkdv.family, "family");
  const detail::KernelFamily& last = detail::family_named(kernels.finish.family, "family");
  if (forward.seqlen_q == 0) {  // no row sees a key: dk and dv are zero, written by dK/dV alone
    detail::launch(kernels.main.function, dkdv.plan(kernels.dkdv, forward, impl_->device),
                   problem.params, stream);
    return;
  }
  void* workspace = options.workspace != nullptr
                        ? options.workspace
                        : impl_->workspaces.get(context.get(), stream, bytes);
  const BackwardParams params = problem.with_workspace(workspace);
  const detail::LaunchPlan rows =
      detail::bwd_rows_plan(params.seqlen_rows, forward.heads_q, forward.batch);
  detail::launch(kernels.prep.function, rows, params, stream);
  detail::launch(kernels.main.function, dkdv.plan(kernels.dkdv, forward, impl_->device), params,
                 stream);
  detail::launch(kernels.last.function,
                 problem.deterministic ? last.plan(kernels.finish, forward, impl_->device) : rows,
                 params, stream);
}

std::size_t Engine::backward_workspace_bytes(const TensorView& q, const TensorView& k,
                                             const TensorView& v,
                                             const BackwardOptions& options) const {
  return detail::validate_backward(q, k, v, options).workspace_bytes();
}

Variant Engine::select_backward_variant(const TensorView& q, const TensorView& k,
                                        const TensorView& v,
                                        const BackwardOptions& options) const {
  return detail::select_backward_variant(detail::validate_backward(q, k, v, options),
                                         impl_->device, options);
}

}  // namespace flashjit

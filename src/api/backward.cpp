// Engine::backward: validate -> (first time for this layout: choose and load the kernels, plan
// the launches) -> on the caller's stream, bwd_prep (row terms, and a zeroed dQ accumulator where
// one is used), bwd_sink where the sinks' gradient is asked for, the dK/dV kernel, then the dQ
// kernel (bwd_wgmma's in both modes, bwd_mma's when deterministic), or bwd_convert turning the
// accumulator the dK/dV kernel's atomics summed into dq.
#include <fmt/format.h>

#include "api/engine_impl.hpp"
#include "families/block_mask/block_mask.hpp"
#include "families/registry.hpp"
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
  kernels.dq_accumulator = detail::uses_dq_accumulator(kernels.finish);
  kernels.dq_accumulator_blocks =
      detail::family_named(kernels.dkdv.family, "family").dq_accumulator_blocks;
  const Variant prep = detail::bwd_prep_variant(device.arch, problem.forward.dtype,
                                                problem.forward.head_dim);
  kernels.prep = load(context, prep);
  kernels.main = load(context, kernels.dkdv);
  kernels.last = load(context, kernels.finish);
  if (problem.params.dsink != nullptr) {
    const Variant sink = detail::bwd_sink_variant(device.arch, problem.forward.dtype,
                                                  problem.forward.head_dim);
    kernels.sink = load(context, sink);
    record(sink);
  }
  record(prep);
  record(kernels.dkdv);
  record(kernels.finish);
  return backward_kernel_sets.emplace(key, std::move(kernels)).first->second;
}

void Engine::backward(const TensorView& q, const TensorView& k, const TensorView& v,
                      const TensorView& out, const TensorView& dout, const float* lse,
                      const TensorView& dq, const TensorView& dk, const TensorView& dv,
                      const BackwardOptions& options, CUstream_st* stream) {
  impl_->backward(detail::validate_backward(q, k, v, out, dout, lse, dq, dk, dv, nullptr, options),
                  options, stream);
}

void Engine::backward(const TensorView& q, const TensorView& k, const TensorView& v,
                      const TensorView& out, const TensorView& dout, const float* lse,
                      const TensorView& dq, const TensorView& dk, const TensorView& dv,
                      const VarlenBatch& varlen, const BackwardOptions& options,
                      CUstream_st* stream) {
  impl_->backward(detail::validate_backward(q, k, v, out, dout, lse, dq, dk, dv, &varlen, options),
                  options, stream);
}

BlockMask Engine::create_backward_block_mask(const TensorView& q, const TensorView& k,
                                             const TensorView& v, const BackwardOptions& options,
                                             const BlockMaskOptions& mask_options,
                                             CUstream_st* stream) {
  return impl_->backward_block_mask(*this, detail::validate_backward(q, k, v, nullptr, options),
                                    options, mask_options, stream);
}

BlockMask Engine::create_backward_block_mask(const TensorView& q, const TensorView& k,
                                             const TensorView& v, const VarlenBatch& varlen,
                                             const BackwardOptions& options,
                                             const BlockMaskOptions& mask_options,
                                             CUstream_st* stream) {
  return impl_->backward_block_mask(*this, detail::validate_backward(q, k, v, &varlen, options),
                                    options, mask_options, stream);
}

BlockMask Engine::Impl::backward_block_mask(const Engine& engine,
                                            const detail::BackwardProblem& problem,
                                            const BackwardOptions& options,
                                            const BlockMaskOptions& mask_options,
                                            CUstream_st* stream) {
  if (!problem.forward.mask_mod)
    throw Error(ErrorCode::invalid_argument,
                "create_backward_block_mask: options.user_functions has no mask_mod: expected "
                "user functions with the mask_mod to build the block mask of");
  const Variant dkdv = detail::select_backward_variant(problem, device, options);
  const Variant finish = detail::backward_finish_variant(problem, dkdv);
  detail::BlockMaskData mask =
      detail::plan_backward_block_mask(engine, dkdv, problem.forward, mask_options);
  const bool dq_kernel =
      detail::family_named(finish.family, "family").role == detail::FamilyRole::backward_dq;
  if (dq_kernel)
    mask.dq = std::make_shared<const detail::BlockMaskData>(
        detail::plan_block_mask(engine, finish, problem.forward, mask_options));
  const detail::LaunchContext context(stream, primary.get());
  build_map(context, detail::backward_block_mask_variant(dkdv), problem.forward.params, mask,
            stream);
  if (mask.dq)
    build_map(context, detail::block_mask_variant(finish), problem.forward.params, *mask.dq,
              stream);
  return detail::BlockMaskAccess::make(std::move(mask));
}

std::shared_ptr<const detail::BackwardLaunch> Engine::Impl::prepare_backward(
    const detail::BackwardPlanKey& key, CUcontext context, const detail::BackwardProblem& problem,
    const BackwardOptions& options) {
  auto ready = std::make_shared<detail::BackwardLaunch>();
  const detail::BackwardKernels& kernels = backward_kernels(context, problem, options);
  ready->kernels = &kernels;
  const detail::ForwardProblem& forward = problem.forward;
  // The plans read only the params' tensors and their layout, not the workspace.
  ready->dkdv = detail::backward_launch_plan(kernels.dkdv, forward, problem.params, device);
  if (forward.seqlen_q > 0) {
    ready->prep =
        detail::bwd_prep_plan(forward.head_dim, forward.seqlen_q, forward.heads_q, forward.batch);
    ready->finish =
        kernels.dq_accumulator
            ? detail::bwd_convert_plan(forward.head_dim, forward.seqlen_q, forward.heads_q,
                                       forward.batch)
            : detail::backward_launch_plan(kernels.finish, forward, problem.params, device);
  }
  if (problem.params.dsink != nullptr) ready->sink = detail::bwd_sink_plan(forward.heads_q);
  for (detail::LaunchPlan* plan : {&ready->prep, &ready->sink, &ready->dkdv, &ready->finish})
    plan->overlaps_previous = detail::may_overlap_previous(device);
  backward_plans.insert(key, ready);
  return ready;
}

void Engine::Impl::backward(detail::BackwardProblem problem, const BackwardOptions& options,
                            CUstream_st* stream) {
  const detail::ForwardProblem& forward = problem.forward;
  if (forward.batch == 0 || forward.heads_q == 0 || forward.seqlen_k == 0) return;
  const detail::LaunchContext context(stream, primary.get());
  // An unknown options.family leaves forced null: the slow path names it in its error.
  const detail::KernelFamily* forced =
      options.family ? detail::find_family(*options.family) : nullptr;
  const auto key = detail::BackwardPlanKey::of(context.get(), problem, options, forced);
  std::shared_ptr<const detail::BackwardLaunch> ready;
  if (!options.family || forced != nullptr) ready = backward_plans.find(key);
  if (!ready) ready = prepare_backward(key, context.get(), problem, options);
  const detail::BackwardKernels& kernels = *ready->kernels;
  // A block mask: the dK/dV launch reads its key-major map, the dQ kernel's its own (both
  // through the forward params' block fields; no other backward kernel reads them).
  const detail::BlockMaskData* mask =
      options.block_mask ? &detail::BlockMaskAccess::data(*options.block_mask) : nullptr;
  if (mask) detail::check_backward_block_mask(*mask, forward, kernels.dkdv, kernels.finish);
  problem.dq_accumulator = kernels.dq_accumulator;
  problem.params.dq_accum_blocks = kernels.dq_accumulator_blocks ? 1 : 0;
  const std::size_t bytes = problem.workspace_bytes();
  if (options.workspace != nullptr && options.workspace_bytes < bytes)
    throw Error(ErrorCode::invalid_argument,
                fmt::format("options.workspace_bytes is {}: expected at least {} "
                            "(Engine::backward_workspace_bytes for these arguments)",
                            options.workspace_bytes, bytes));
  if (forward.seqlen_q == 0) {  // no row sees a key: dk and dv are zero, written by dK/dV alone
    if (problem.params.dsink != nullptr)  // no rows: bwd_sink writes zeros, reading nothing
      detail::launch(kernels.sink.function, ready->sink, problem.params, stream);
    detail::launch(kernels.main.function, ready->dkdv, problem.params, stream);
    return;
  }
  void* workspace = options.workspace != nullptr ? options.workspace
                                                 : workspaces.get(context.get(), stream, bytes);
  const BackwardParams params = problem.with_workspace(workspace);
  detail::launch(kernels.prep.function, ready->prep, params, stream);
  if (params.dsink != nullptr) detail::launch(kernels.sink.function, ready->sink, params, stream);
  if (mask == nullptr) {
    detail::launch(kernels.main.function, ready->dkdv, params, stream);
    detail::launch(kernels.last.function, ready->finish, params, stream);
    return;
  }
  BackwardParams listed = params;
  detail::use_block_mask(listed.fwd, *mask);
  detail::launch(kernels.main.entry(true), ready->dkdv, listed, stream);
  if (mask->dq) detail::use_block_mask(listed.fwd, *mask->dq);
  // bwd_convert (no dQ map) reads no block mask.
  detail::launch(kernels.last.entry(mask->dq != nullptr), ready->finish, listed, stream);
}

namespace {

std::size_t workspace_bytes_of(detail::BackwardProblem problem, const DeviceInfo& device,
                               const BackwardOptions& options) {
  const Variant dkdv = detail::select_backward_variant(problem, device, options);
  problem.dq_accumulator =
      detail::uses_dq_accumulator(detail::backward_finish_variant(problem, dkdv));
  return problem.workspace_bytes();
}

}  // namespace

std::size_t Engine::backward_workspace_bytes(const TensorView& q, const TensorView& k,
                                             const TensorView& v,
                                             const BackwardOptions& options) const {
  return workspace_bytes_of(detail::validate_backward(q, k, v, nullptr, options), impl_->device,
                            options);
}

std::size_t Engine::backward_workspace_bytes(const TensorView& q, const TensorView& k,
                                             const TensorView& v, const VarlenBatch& varlen,
                                             const BackwardOptions& options) const {
  return workspace_bytes_of(detail::validate_backward(q, k, v, &varlen, options), impl_->device,
                            options);
}

Variant Engine::select_backward_variant(const TensorView& q, const TensorView& k,
                                        const TensorView& v,
                                        const BackwardOptions& options) const {
  return detail::select_backward_variant(detail::validate_backward(q, k, v, nullptr, options),
                                         impl_->device, options);
}

Variant Engine::select_backward_variant(const TensorView& q, const TensorView& k,
                                        const TensorView& v, const VarlenBatch& varlen,
                                        const BackwardOptions& options) const {
  return detail::select_backward_variant(detail::validate_backward(q, k, v, &varlen, options),
                                         impl_->device, options);
}

}  // namespace flashjit

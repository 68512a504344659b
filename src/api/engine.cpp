// Engine::forward: validate -> (first time for this shape: dispatch, fetch kernel, load, plan)
// -> launch on the caller's stream.
#include <fmt/format.h>

#include "api/engine_impl.hpp"

namespace flashjit {


std::shared_ptr<const detail::BackgroundCompile> Engine::Impl::compile_in_background(
    const Variant& variant) {
  std::lock_guard lock(background_mutex);
  auto& state = background[variant.name()];
  if (state) return state;
  state = std::make_shared<detail::BackgroundCompile>();
  detail::log().info("compiling {} in the background", variant.name());
  compiles.push_back(std::async(std::launch::async, [cache = cache, variant, state] {
    try {
      cache->impl_->get(variant);
    } catch (const std::exception& e) {
      detail::log().warn("background compile of {} failed; its stand-in stays: {}", variant.name(),
                         e.what());
      state->failed = true;
    }
    state->done.store(true, std::memory_order_release);
  }));
  return state;
}

void Engine::Impl::choose_kernel(detail::ReadyLaunch& ready, const Variant& preferred,
                                 const detail::ForwardProblem& problem,
                                 const detail::KernelFamily* forced, bool tiles_forced) {
  ready.variant = preferred;
  // Forced tiles are the caller's explicit choice: never replaced by a stand-in.
  if (!never_block || tiles_forced) {
    ready.kernel = cache->impl_->get(preferred);
    return;
  }
  if ((ready.kernel = cache->impl_->get_if_built(preferred))) return;
  auto pending = compile_in_background(preferred);
  for (const Variant& candidate : detail::fallback_variants(problem, device, forced)) {
    if (candidate == preferred) continue;
    if (auto kernel = cache->impl_->get_if_built(candidate)) {
      ready.variant = candidate;
      ready.kernel = std::move(kernel);
      // A failed compile leaves the stand-in for good; else the next call after it is done
      // plans again and finds the compiled kernel.
      if (!pending->failed) ready.stand_in_for = pending;
      detail::log().info("running {} while {} compiles", candidate.name(), preferred.name());
      return;
    }
  }
  ready.kernel = cache->impl_->get(preferred);  // nothing compiled to stand in: wait for it
}

void Engine::Impl::record(const Variant& variant) {
  std::lock_guard lock(record_mutex);
  if (!record_file || !recorded.insert(variant.name()).second) return;
  if (std::string error = detail::append_manifest_line(*record_file, variant.name());
      !error.empty())
    detail::log().warn("cannot record {} in the usage manifest: {}", variant.name(), error);
}

void Engine::Impl::check_context_device() const {
  CUdevice context_device = 0;
  detail::check(detail::driver().cuCtxGetDevice(&context_device), "cuCtxGetDevice");
  if (context_device != primary.device())
    throw Error(ErrorCode::invalid_argument,
                fmt::format("stream belongs to device {}: expected a stream of device {} (the "
                            "engine's)",
                            context_device, device.ordinal));
}

Engine::Impl::MergeKernel Engine::Impl::merge_kernel(CUcontext context, DType dtype,
                                                     int head_dim) {
  std::lock_guard lock(merge_mutex);
  MergeKernel& merge = merge_kernels[{context, dtype, head_dim}];
  if (merge.function == nullptr) {
    check_context_device();
    merge = load(context, detail::merge_variant(device.arch, dtype, head_dim));
  }
  return merge;
}

detail::LoadedKernel Engine::Impl::loaded(CUcontext context, const detail::CompiledKernel& kernel) {
  return modules.get(context, {kernel.key, kernel.cubin, kernel.lowered_name,
                               kernel.entry.dynamic_shared_bytes, kernel.block_mask_lowered_name});
}

detail::KernelHandle Engine::Impl::load(CUcontext context, const Variant& variant) {
  detail::KernelHandle handle;
  handle.kernel = cache->impl_->get(variant);
  handle.use(loaded(context, *handle.kernel));
  return handle;
}

void* Engine::Impl::workspace_for(const detail::ReadyLaunch& ready, const ForwardOptions& options,
                                  CUcontext context, CUstream stream) {
  if (options.workspace == nullptr) return workspaces.get(context, stream, ready.workspace_bytes);
  if (options.workspace_bytes < ready.workspace_bytes)
    throw Error(ErrorCode::invalid_argument,
                fmt::format("options.workspace_bytes is {}: expected at least {} "
                            "(Engine::workspace_bytes for these arguments)",
                            options.workspace_bytes, ready.workspace_bytes));
  return options.workspace;
}

std::shared_ptr<const detail::ReadyLaunch> Engine::Impl::prepare(
    const detail::PlanKey& key, const detail::ForwardProblem& problem,
    const std::optional<TileConfig>& tiles) {
  check_context_device();
  auto ready = std::make_shared<detail::ReadyLaunch>();
  const Variant preferred = detail::select_variant(problem, device, key.forced_family, tiles);
  choose_kernel(*ready, preferred, problem, key.forced_family, tiles.has_value());
  ready->use(loaded(key.context, *ready->kernel));
  const detail::KernelFamily& family = detail::family_named(ready->variant.family, "family");
  ready->plan = family.plan(ready->variant, problem, device);
  ready->plan.overlaps_previous = detail::may_overlap_previous(device);
  const detail::SplitPlan split = detail::plan_splits(family, ready->variant, problem, device);
  ready->num_splits = split.num_splits;
  ready->split_tiles = split.split_tiles;
  ready->workspace_bytes = split.workspace_bytes;
  ready->lse_offset = split.lse_offset;
  if (split.num_splits > 1) {
    const MergeKernel merge = merge_kernel(key.context, problem.dtype, problem.head_dim);
    ready->merge = detail::MergeLaunch{
        merge.kernel, merge.function,
        detail::merge_plan(static_cast<long long>(problem.batch) * problem.seqlen_q *
                           problem.heads_q)};
    ready->merge->plan.overlaps_previous = detail::may_overlap_previous(device);
  }
  if (ready->plan.maps.size() > detail::LaunchPlan::kMaxMaps ||
      ready->plan.values.size() > detail::LaunchPlan::kMaxValues)
    throw Error(
        ErrorCode::unsupported,
        fmt::format("family {} plans {} tensor maps and {} values: at most {} and {}",
                    ready->variant.family, ready->plan.maps.size(), ready->plan.values.size(),
                    detail::LaunchPlan::kMaxMaps, detail::LaunchPlan::kMaxValues));
  record(preferred);  // what the process needs precompiled, not its stand-in
  plans.insert(key, ready);
  return ready;
}

Engine::Engine(int device, std::shared_ptr<KernelCache> cache)
    : impl_(std::make_unique<Impl>(device, std::move(cache))) {
  detail::log().debug("engine on device {} ({}, {})", device, impl_->device.name,
                      impl_->device.arch);
  if (const char* file = std::getenv("FLASHJIT_RECORD"); file != nullptr && *file != '\0')
    record_variants(file);
  if (const char* never = std::getenv("FLASHJIT_NEVER_BLOCK");
      never != nullptr && std::string_view(never) == "1")
    set_never_block(true);
}

void Engine::set_never_block(bool on) { impl_->never_block = on; }

void Engine::wait_for_background_compiles() {
  std::vector<std::shared_future<void>> pending;
  {
    std::lock_guard lock(impl_->background_mutex);
    for (auto& compile : impl_->compiles)
      if (compile.valid()) pending.push_back(compile.share());
    impl_->compiles.clear();
  }
  for (auto& compile : pending) compile.wait();
}

Variant Engine::running_variant(const TensorView& q, const TensorView& k, const TensorView& v,
                                const TensorView& out, const ForwardOptions& options,
                                CUstream_st* stream) const {
  return running_variant(q, KVCache::dense(k, v), out, options, stream);
}

Variant Engine::running_variant(const TensorView& q, const KVCache& kv, const TensorView& out,
                                const ForwardOptions& options, CUstream_st* stream) const {
  const auto problem = detail::validate_forward(q, kv, out, nullptr, options);
  const detail::KernelFamily* forced = detail::forced_family(options.family);
  if (!problem.empty()) {
    const detail::LaunchContext context(stream, impl_->primary.get());
    if (auto ready =
            impl_->plans.find(detail::PlanKey::of(context.get(), problem, forced, options.tiles)))
      return ready->variant;
  }
  return detail::select_variant(problem, impl_->device, forced, options.tiles);
}

void Engine::record_variants(const std::filesystem::path& file) {
  std::lock_guard lock(impl_->record_mutex);
  impl_->record_file = file.empty() ? std::nullopt : std::optional(file);
  impl_->recorded.clear();
}

Engine::~Engine() = default;

const DeviceInfo& Engine::device() const { return impl_->device; }
KernelCache& Engine::cache() const { return *impl_->cache; }
CUctx_st* Engine::context() const { return impl_->primary.get(); }

Variant Engine::select_variant(const TensorView& q, const TensorView& k, const TensorView& v,
                               const TensorView& out, const ForwardOptions& options) const {
  return select_variant(q, KVCache::dense(k, v), out, options);
}

Variant Engine::select_variant(const TensorView& q, const KVCache& kv, const TensorView& out,
                               const ForwardOptions& options) const {
  return impl_->selected(detail::validate_forward(q, kv, out, nullptr, options), options);
}

Variant Engine::select_variant(const TensorView& q, const KVCache& kv, const TensorView& out,
                               const VarlenBatch& varlen, const ForwardOptions& options) const {
  return impl_->selected(detail::validate_forward(q, kv, out, &varlen, options), options);
}

void Engine::forward(const TensorView& q, const TensorView& k, const TensorView& v,
                     const TensorView& out, const ForwardOptions& options, CUstream_st* stream) {
  forward(q, KVCache::dense(k, v), out, options, stream);
}

void Engine::forward(const TensorView& q, const KVCache& kv, const TensorView& out,
                     const ForwardOptions& options, CUstream_st* stream) {
  impl_->run(detail::validate_forward(q, kv, out, nullptr, options), options, stream);
}

void Engine::forward(const TensorView& q, const KVCache& kv, const TensorView& out,
                     const VarlenBatch& varlen, const ForwardOptions& options,
                     CUstream_st* stream) {
  impl_->run(detail::validate_forward(q, kv, out, &varlen, options), options, stream);
}

Variant Engine::Impl::selected(const detail::ForwardProblem& problem,
                               const ForwardOptions& options) const {
  if (options.block_mask != nullptr) {  // its variant, or an error
    const detail::BlockMaskData& mask = detail::BlockMaskAccess::data(*options.block_mask);
    detail::check_block_mask(mask, problem, options.family);
    return mask.variant;
  }
  return detail::select_variant(problem, device, detail::forced_family(options.family),
                                options.tiles);
}

BlockMask Engine::Impl::block_mask(const Engine& engine, const detail::ForwardProblem& problem,
                                   const ForwardOptions& options,
                                   const BlockMaskOptions& mask_options, CUstream_st* stream) {
  if (!problem.mask_mod)
    throw Error(ErrorCode::invalid_argument,
                "create_block_mask: options.user_functions has no mask_mod: expected user "
                "functions with the mask_mod to build the block mask of");
  ForwardOptions unmasked = options;
  unmasked.block_mask = nullptr;
  const Variant attention = selected(problem, unmasked);
  const detail::KernelFamily& family = detail::family_named(attention.family, "family");
  if (!(family.features & detail::kFeatureBlockMask))
    throw Error(ErrorCode::invalid_argument,
                fmt::format("create_block_mask: this problem runs on family {}, which takes no "
                            "block mask: expected a problem the wgmma family runs (sm_90a)",
                            attention.family));
  detail::BlockMaskData mask = detail::plan_block_mask(engine, attention, problem, mask_options);
  const detail::LaunchContext context(stream, primary.get());
  build_map(context, detail::block_mask_variant(attention), problem.params, mask, stream);
  return detail::BlockMaskAccess::make(std::move(mask));
}

void Engine::Impl::build_map(const detail::LaunchContext& context, const Variant& builder,
                             const FmhaParams& problem_params, const detail::BlockMaskData& map,
                             CUstream_st* stream) {
  if (!map.memory) return;
  check_context_device();
  auto kernel = cache->impl_->get(builder);
  record(builder);  // a fleet's manifest warms the builder too
  const CUfunction function = loaded(context.get(), *kernel).function;
  FmhaParams params = problem_params;
  detail::use_block_mask(params, map);
  detail::LaunchPlan plan = detail::block_mask_plan(map.rows(), map.heads, map.batches);
  plan.overlaps_previous = detail::may_overlap_previous(device);
  detail::launch(function, plan, params, stream);
}

BlockMask Engine::create_block_mask(const TensorView& q, const TensorView& k, const TensorView& v,
                                    const TensorView& out, const ForwardOptions& options,
                                    const BlockMaskOptions& mask_options, CUstream_st* stream) {
  return create_block_mask(q, KVCache::dense(k, v), out, options, mask_options, stream);
}

BlockMask Engine::create_block_mask(const TensorView& q, const KVCache& kv, const TensorView& out,
                                    const ForwardOptions& options,
                                    const BlockMaskOptions& mask_options, CUstream_st* stream) {
  return impl_->block_mask(*this, detail::validate_forward(q, kv, out, nullptr, options), options,
                           mask_options, stream);
}

BlockMask Engine::create_block_mask(const TensorView& q, const KVCache& kv, const TensorView& out,
                                    const VarlenBatch& varlen, const ForwardOptions& options,
                                    const BlockMaskOptions& mask_options, CUstream_st* stream) {
  return impl_->block_mask(*this, detail::validate_forward(q, kv, out, &varlen, options), options,
                           mask_options, stream);
}

detail::SplitPlan Engine::Impl::split_plan(const detail::ForwardProblem& problem,
                                           const ForwardOptions& options) const {
  if (problem.empty()) return {};
  const Variant variant = selected(problem, options);
  return detail::plan_splits(detail::family_named(variant.family, "family"), variant, problem,
                             device);
}

void Engine::Impl::run(const detail::ForwardProblem& problem, const ForwardOptions& options,
                       CUstream_st* stream) {
  if (problem.empty()) return;  // nothing to compute: documented no-op
  const detail::KernelFamily* forced = detail::forced_family(options.family);
  std::optional<TileConfig> tiles = options.tiles;
  const detail::BlockMaskData* mask =
      options.block_mask ? &detail::BlockMaskAccess::data(*options.block_mask) : nullptr;
  if (mask) {  // runs exactly the variant the mask lists tiles for
    detail::check_block_mask(*mask, problem, options.family);
    forced = &detail::family_named(mask->variant.family, "family");
    tiles = TileConfig{mask->variant.tile_m, mask->variant.tile_n, mask->variant.stages};
  }
  const detail::LaunchContext context(stream, primary.get());
  const auto key = detail::PlanKey::of(context.get(), problem, forced, tiles);
  auto ready = plans.find(key);
  // A stand-in is replanned once the kernel it stands in for is done compiling.
  if (!ready || (ready->stand_in_for && ready->stand_in_for->done.load(std::memory_order_acquire)))
    ready = prepare(key, problem, tiles);
  FmhaParams params = problem.params;
  if (mask) {
    if (!(ready->variant == mask->variant))
      throw Error(ErrorCode::invalid_argument,
                  fmt::format("options.block_mask was built for {}: this forward runs {}",
                              mask->variant.name(), ready->variant.name()));
    detail::use_block_mask(params, *mask);
  }
  params.num_splits = ready->num_splits;
  params.split_tiles = ready->split_tiles;
  if (ready->plan.takes_tile_counter)
    params.tile_counter = static_cast<int*>(
        tile_counters.get_stream_ordered(context.get(), stream, kTileCounterInts * sizeof(int)));
  const CUfunction function = ready->entry(mask != nullptr);
  if (!ready->merge) {
    detail::launch(function, ready->plan, params, stream);
    return;
  }
  auto* workspace = static_cast<std::byte*>(workspace_for(*ready, options, context.get(), stream));
  params.o_partial = reinterpret_cast<float*>(workspace);
  params.lse_partial = reinterpret_cast<float*>(workspace + ready->lse_offset);
  detail::launch(function, ready->plan, params, stream);
  detail::launch(ready->merge->function, ready->merge->plan,
                 detail::split_merge_params(params, problem.head_dim), stream);
}

std::size_t Engine::workspace_bytes(const TensorView& q, const KVCache& kv, const TensorView& out,
                                    const ForwardOptions& options) const {
  return impl_->split_plan(detail::validate_forward(q, kv, out, nullptr, options), options)
      .workspace_bytes;
}

std::size_t Engine::workspace_bytes(const TensorView& q, const KVCache& kv, const TensorView& out,
                                    const VarlenBatch& varlen,
                                    const ForwardOptions& options) const {
  return impl_->split_plan(detail::validate_forward(q, kv, out, &varlen, options), options)
      .workspace_bytes;
}

int Engine::select_num_splits(const TensorView& q, const KVCache& kv, const TensorView& out,
                              const ForwardOptions& options) const {
  return impl_->split_plan(detail::validate_forward(q, kv, out, nullptr, options), options)
      .num_splits;
}

int Engine::select_num_splits(const TensorView& q, const KVCache& kv, const TensorView& out,
                              const VarlenBatch& varlen, const ForwardOptions& options) const {
  return impl_->split_plan(detail::validate_forward(q, kv, out, &varlen, options), options)
      .num_splits;
}

void Engine::merge_attention_states(const TensorView& out_a, const float* lse_a,
                                    const TensorView& out_b, const float* lse_b,
                                    const TensorView& out, float* lse_out, CUstream_st* stream) {
  const MergeParams params = detail::validate_merge(out_a, lse_a, out_b, lse_b, out, lse_out);
  const long long rows = static_cast<long long>(params.batch) * params.seqlen * params.heads;
  if (rows == 0) return;
  const detail::LaunchContext context(stream, impl_->primary.get());
  const auto merge =
      impl_->merge_kernel(context.get(), out_a.dtype, static_cast<int>(out_a.shape[3]));
  detail::LaunchPlan plan = detail::merge_plan(rows);
  plan.overlaps_previous = detail::may_overlap_previous(impl_->device);
  detail::launch(merge.function, plan, params, stream);
}

}  // namespace flashjit

// Engine::forward: validate -> (first time for this shape: dispatch, fetch kernel, load, plan)
// -> launch on the caller's stream.
#include <fmt/format.h>

#include <cstdlib>
#include <mutex>
#include <set>

#include "api/dispatch.hpp"
#include "api/kernel_cache_impl.hpp"
#include "api/launch_plans.hpp"
#include "api/manifest.hpp"
#include "api/validate.hpp"
#include "core/log.hpp"
#include "cuda/context.hpp"
#include "cuda/device.hpp"
#include "cuda/driver.hpp"
#include "cuda/modules.hpp"
#include "families/registry.hpp"

namespace flashjit {

// Hidden like everything internal (a nested class takes its enclosing class's visibility).
struct __attribute__((visibility("hidden"))) Engine::Impl {
  Impl(int ordinal, std::shared_ptr<KernelCache> shared_cache)
      : device(detail::query_device(ordinal)),
        primary(ordinal),
        cache(shared_cache ? std::move(shared_cache) : std::make_shared<KernelCache>()) {}

  // Everything a first forward of this key needs: the context's device checked, the variant
  // chosen, its kernel compiled or loaded, its module loaded in the context, its launch planned.
  std::shared_ptr<const detail::ReadyLaunch> prepare(const detail::PlanKey& key,
                                                     const detail::ForwardProblem& problem,
                                                     const std::optional<TileConfig>& tiles);

  // Appends the variant to the usage manifest, once per engine (the slow path only).
  void record(const Variant& variant);

  DeviceInfo device;
  detail::PrimaryContext primary;  // declared before modules: they unload while it is retained
  std::shared_ptr<KernelCache> cache;
  detail::ModuleCache modules;
  detail::LaunchPlans plans;
  std::mutex record_mutex;
  std::optional<std::filesystem::path> record_file;
  std::set<std::string> recorded;
};

void Engine::Impl::record(const Variant& variant) {
  std::lock_guard lock(record_mutex);
  if (!record_file || !recorded.insert(variant.name()).second) return;
  if (std::string error = detail::append_manifest_line(*record_file, variant.name());
      !error.empty())
    detail::log().warn("cannot record {} in the usage manifest: {}", variant.name(), error);
}

std::shared_ptr<const detail::ReadyLaunch> Engine::Impl::prepare(
    const detail::PlanKey& key, const detail::ForwardProblem& problem,
    const std::optional<TileConfig>& tiles) {
  const auto& cu = detail::driver();
  CUdevice context_device = 0;
  detail::check(cu.cuCtxGetDevice(&context_device), "cuCtxGetDevice");
  if (context_device != primary.device())
    throw Error(ErrorCode::invalid_argument,
                fmt::format("stream belongs to device {}: expected a stream of device {} (the "
                            "engine's)",
                            context_device, device.ordinal));
  auto ready = std::make_shared<detail::ReadyLaunch>();
  ready->variant = detail::select_variant(problem, device, key.forced_family, tiles);
  ready->kernel = cache->impl_->get(ready->variant);
  const detail::CompiledKernel& kernel = *ready->kernel;
  ready->function = modules
                        .get(key.context, {kernel.key, kernel.cubin, kernel.lowered_name,
                                           kernel.entry.dynamic_shared_bytes})
                        .function;
  ready->plan = detail::family_named(ready->variant.family, "family").plan(ready->variant, problem,
                                                                            device);
  if (ready->plan.maps.size() > detail::LaunchPlan::kMaxMaps ||
      ready->plan.values.size() > detail::LaunchPlan::kMaxValues)
    throw Error(ErrorCode::unsupported,
                fmt::format("family {} plans {} tensor maps and {} values: at most {} and {}",
                            ready->variant.family, ready->plan.maps.size(),
                            ready->plan.values.size(), detail::LaunchPlan::kMaxMaps,
                            detail::LaunchPlan::kMaxValues));
  record(ready->variant);
  plans.insert(key, ready);
  return ready;
}

Engine::Engine(int device, std::shared_ptr<KernelCache> cache)
    : impl_(std::make_unique<Impl>(device, std::move(cache))) {
  detail::log().debug("engine on device {} ({}, {})", device, impl_->device.name,
                      impl_->device.arch);
  if (const char* file = std::getenv("FLASHJIT_RECORD"); file != nullptr && *file != '\0')
    record_variants(file);
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
  const auto problem = detail::validate_forward(q, k, v, out, options);
  return detail::select_variant(problem, impl_->device, detail::forced_family(options.family),
                                options.tiles);
}

void Engine::forward(const TensorView& q, const TensorView& k, const TensorView& v,
                     const TensorView& out, const ForwardOptions& options, CUstream_st* stream) {
  const auto problem = detail::validate_forward(q, k, v, out, options);
  if (problem.empty()) return;  // nothing to compute: documented no-op
  const detail::KernelFamily* forced = detail::forced_family(options.family);
  const detail::LaunchContext context(stream, impl_->primary.get());
  const auto key = detail::PlanKey::of(context.get(), problem, forced, options.tiles);
  auto ready = impl_->plans.find(key);
  if (!ready) ready = impl_->prepare(key, problem, options.tiles);
  detail::launch(ready->function, ready->plan, problem.params, stream);
}

}  // namespace flashjit

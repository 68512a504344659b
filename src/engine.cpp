// Engine::forward: validate -> dispatch -> fetch kernel -> launch on the caller's stream.
#include <fmt/format.h>

#include "device.hpp"
#include "dispatch.hpp"
#include "driver.hpp"
#include "families.hpp"
#include "kernel_cache_impl.hpp"
#include "log.hpp"
#include "module_cache.hpp"
#include "validate.hpp"

namespace flashjit {

namespace {

// The device's primary context, retained for the engine's lifetime.
struct PrimaryContext {
  CUdevice device = 0;
  CUcontext context = nullptr;
  explicit PrimaryContext(int ordinal) {
    const auto& cu = detail::driver();
    detail::check(cu.cuDeviceGet(&device, ordinal), "cuDeviceGet");
    detail::check(cu.cuDevicePrimaryCtxRetain(&context, device), "cuDevicePrimaryCtxRetain");
  }
  ~PrimaryContext() { detail::driver().cuDevicePrimaryCtxRelease(device); }
  PrimaryContext(const PrimaryContext&) = delete;
  PrimaryContext& operator=(const PrimaryContext&) = delete;
};

}  // namespace

struct Engine::Impl {
  Impl(int ordinal, std::shared_ptr<KernelCache> shared_cache)
      : device(detail::query_device(ordinal)),
        primary(ordinal),
        cache(shared_cache ? std::move(shared_cache) : std::make_shared<KernelCache>()) {}

  DeviceInfo device;
  PrimaryContext primary;  // declared before modules: they unload while it is still retained
  std::shared_ptr<KernelCache> cache;
  detail::ModuleCache modules;

  // The context the launch belongs to: the stream's, else the current one, else the primary.
  CUcontext context_for(CUstream stream) const {
    const auto& cu = detail::driver();
    CUcontext context = nullptr;
    if (stream != nullptr) detail::check(cu.cuStreamGetCtx(stream, &context), "cuStreamGetCtx");
    else detail::check(cu.cuCtxGetCurrent(&context), "cuCtxGetCurrent");
    return context != nullptr ? context : primary.context;
  }
};

Engine::Engine(int device, std::shared_ptr<KernelCache> cache)
    : impl_(std::make_unique<Impl>(device, std::move(cache))) {
  detail::log().debug("engine on device {} ({}, {})", device, impl_->device.name,
                      impl_->device.arch);
}

Engine::~Engine() = default;

const DeviceInfo& Engine::device() const { return impl_->device; }
KernelCache& Engine::cache() const { return *impl_->cache; }
CUctx_st* Engine::context() const { return impl_->primary.context; }

Variant Engine::select_variant(const TensorView& q, const TensorView& k, const TensorView& v,
                               const TensorView& out, const ForwardOptions& options) const {
  const auto problem = detail::validate_forward(q, k, v, out, options);
  return detail::select_variant(problem, impl_->device, options.family, options.tiles);
}

void Engine::forward(const TensorView& q, const TensorView& k, const TensorView& v,
                     const TensorView& out, const ForwardOptions& options, CUstream_st* stream) {
  const auto problem = detail::validate_forward(q, k, v, out, options);
  if (problem.empty()) return;  // nothing to compute: documented no-op
  const Variant variant =
      detail::select_variant(problem, impl_->device, options.family, options.tiles);
  const auto kernel = impl_->cache->impl().get(variant);

  const auto& cu = detail::driver();
  const CUcontext context = impl_->context_for(stream);
  detail::ScopedContext scope(context);
  CUdevice context_device = 0;
  detail::check(cu.cuCtxGetDevice(&context_device), "cuCtxGetDevice");
  if (context_device != impl_->primary.device)
    throw Error(ErrorCode::invalid_argument,
                fmt::format("stream belongs to device {}: expected a stream of device {} (the "
                            "engine's)",
                            context_device, impl_->device.ordinal));
  const detail::LoadedKernel loaded = impl_->modules.get(context, *kernel);
  const detail::FamilyTraits& traits = detail::family_traits(variant.family);
  detail::LaunchPlan plan = traits.plan(variant, problem);

  std::vector<void*> args = {const_cast<detail::FmhaParams*>(&problem.params)};
  for (auto& extra : plan.extra_args) args.push_back(extra.data());
  CUlaunchConfig config{};
  config.gridDimX = plan.grid[0];
  config.gridDimY = plan.grid[1];
  config.gridDimZ = plan.grid[2];
  config.blockDimX = plan.block[0];
  config.blockDimY = plan.block[1];
  config.blockDimZ = plan.block[2];
  config.sharedMemBytes = plan.shared_bytes;
  config.hStream = stream;
  detail::check(cu.cuLaunchKernelEx(&config, loaded.function, args.data(), nullptr),
                "cuLaunchKernelEx");
}

}  // namespace flashjit

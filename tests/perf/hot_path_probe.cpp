// flashjit_hot_path_probe: where the host time of a warm forward goes. Times, per call and over
// bursts of back-to-back calls (as `flashjit bench` does), the whole forward and each step of
// it alone: argument validation, the launch context, the plan lookup, re-addressing the tensor
// maps, and the driver's launch with fixed arguments. White-box: links the library's objects.
//
//   flashjit_hot_path_probe [--calls 10000] [--head-dim 128]
#include <fmt/format.h>

#include <algorithm>
#include <chrono>
#include <cstring>
#include <functional>
#include <string>
#include <vector>

#include "api/dispatch.hpp"
#include "api/launch_plans.hpp"
#include "api/validate.hpp"
#include "cuda/context.hpp"
#include "cuda/driver.hpp"
#include "cuda/launch.hpp"
#include "cuda/modules.hpp"
#include "families/registry.hpp"
#include "flashjit/device_memory.hpp"
#include "flashjit/flashjit.hpp"
#include "jit/kernel_store.hpp"

using namespace flashjit;

namespace {

constexpr int kBurst = 128;  // calls between synchronizations: the launch queue never fills

struct Percentiles {
  double p50, p90, mean;
};

Percentiles time_calls(const Engine& engine, int calls, const std::function<void()>& call) {
  std::vector<double> micros;
  micros.reserve(static_cast<std::size_t>(calls));
  for (int done = 0; done < calls; done += kBurst) {
    for (int i = 0; i < std::min(kBurst, calls - done); ++i) {
      const auto start = std::chrono::steady_clock::now();
      call();
      micros.push_back(
          std::chrono::duration<double, std::micro>(std::chrono::steady_clock::now() - start)
              .count());
    }
    synchronize(engine);
  }
  double total = 0;
  for (double us : micros) total += us;
  std::sort(micros.begin(), micros.end());
  return {micros[micros.size() / 2], micros[micros.size() * 9 / 10], total / micros.size()};
}

int flag(int argc, char** argv, const char* name, int fallback) {
  for (int i = 1; i + 1 < argc; ++i)
    if (std::strcmp(argv[i], name) == 0) return std::atoi(argv[i + 1]);
  return fallback;
}

}  // namespace

int main(int argc, char** argv) {
  const int calls = flag(argc, argv, "--calls", 10000);
  const int head_dim = flag(argc, argv, "--head-dim", 128);
  Engine engine(0);
  const int batch = 1, seqlen = 128, heads = 16;
  const std::size_t bytes = std::size_t{2} * batch * seqlen * heads * head_dim;
  DeviceBuffer q(engine, bytes), k(engine, bytes), v(engine, bytes), o(engine, bytes);
  for (DeviceBuffer* b : {&q, &k, &v}) b->fill_bytes(0x3c);  // 1.0-ish in bf16: finite values
  const auto view = [&](const DeviceBuffer& b) {
    return TensorView::bshd(b.data(), DType::bf16, batch, seqlen, heads, head_dim);
  };
  const ForwardOptions options;
  const Stream stream(engine);
  for (int i = 0; i < 10; ++i) engine.forward(view(q), view(k), view(v), view(o), options);
  synchronize(engine);

  // The pieces forward is made of, built as forward builds them.
  const auto problem = detail::validate_forward(view(q), view(k), view(v), view(o), options);
  const Variant variant = detail::select_variant(problem, engine.device(), nullptr);
  detail::KernelStore store(CacheOptions{engine.cache().directory()});
  const auto kernel = store.get(variant, detail::kernel_spec(variant));
  detail::ModuleCache modules;
  const detail::ScopedContext scope(engine.context());
  const CUfunction function =
      modules
          .get(engine.context(), {kernel->key, kernel->cubin, kernel->lowered_name,
                                  kernel->entry.dynamic_shared_bytes})
          .function;
  const detail::LaunchPlan plan =
      detail::family_named(variant.family, "family").plan(variant, problem, engine.device());
  detail::LaunchPlans plans;
  const auto key = detail::PlanKey::of(engine.context(), problem, nullptr, std::nullopt);
  plans.insert(key, std::make_shared<detail::ReadyLaunch>());
  std::vector<void*> fixed_args = {const_cast<FmhaParams*>(&problem.params)};
  std::vector<CUtensorMap> maps;
  for (const auto& m : plan.maps) maps.push_back(m.map);
  for (auto& m : maps) fixed_args.push_back(&m);
  for (const auto& value : plan.values) fixed_args.push_back(const_cast<std::byte*>(value.data()));
  CUlaunchConfig config = detail::launch_config(plan, nullptr);
  const auto& cu = detail::driver();

  fmt::print("{} on {}: {} calls in bursts of {}, microseconds per call\n", variant.name(),
             engine.device().name, calls, kBurst);
  fmt::print("{:<58} {:>7} {:>7} {:>7}\n", "step", "p50", "p90", "mean");
  auto row = [&](const char* what, const std::function<void()>& call) {
    const Percentiles p = time_calls(engine, calls, call);
    fmt::print("{:<58} {:>7.3f} {:>7.3f} {:>7.3f}\n", what, p.p50, p.p90, p.mean);
  };
  CUstream_st* created = stream.get();
  row("forward, default stream (context current)",
      [&] { engine.forward(view(q), view(k), view(v), view(o), options); });
  row("forward, created stream (context current)",
      [&] { engine.forward(view(q), view(k), view(v), view(o), options, created); });
  {
    CUcontext popped = nullptr;
    cu.cuCtxPopCurrent(&popped);  // as a thread that never made a context current
    row("forward, default stream (no context current)",
        [&] { engine.forward(view(q), view(k), view(v), view(o), options); });
    row("forward, created stream (no context current)",
        [&] { engine.forward(view(q), view(k), view(v), view(o), options, created); });
    cu.cuCtxPushCurrent(popped);
  }
  row("validate_forward", [&] {
    auto p = detail::validate_forward(view(q), view(k), view(v), view(o), options);
    asm volatile("" ::"r"(&p) : "memory");
  });
  row("LaunchContext, created stream", [&] { detail::LaunchContext c(created, engine.context()); });
  row("PlanKey + lookup", [&] {
    auto ready = plans.find(detail::PlanKey::of(engine.context(), problem, nullptr, std::nullopt));
    asm volatile("" ::"r"(ready.get()) : "memory");
  });
  row("cuTensorMapReplaceAddress x3", [&] {
    for (int i = 0; i < 3; ++i) cu.cuTensorMapReplaceAddress(&maps[i], q.data());
  });
  row("detail::launch (maps re-addressed + cuLaunchKernelEx)",
      [&] { detail::launch(function, plan, problem.params, created); });
  row("cuCtxPushCurrent + cuCtxPopCurrent", [&] {
    CUcontext popped = nullptr;
    cu.cuCtxPushCurrent(engine.context());
    cu.cuCtxPopCurrent(&popped);
  });
  row("cuStreamGetCtx", [&] {
    CUcontext c = nullptr;
    cu.cuStreamGetCtx(created, &c);
  });
  config.hStream = created;
  CUresult last = CUDA_SUCCESS;
  row("cuLaunchKernelEx alone, fixed arguments, created stream",
      [&] { last = cu.cuLaunchKernelEx(&config, function, fixed_args.data(), nullptr); });
  fmt::print("  (result {})\n", static_cast<int>(last));
  {
    CUcontext popped = nullptr;
    cu.cuCtxPopCurrent(&popped);
    row("cuLaunchKernelEx alone, created stream, no context current",
        [&] { last = cu.cuLaunchKernelEx(&config, function, fixed_args.data(), nullptr); });
    fmt::print("  (result {})\n", static_cast<int>(last));
    cu.cuCtxPushCurrent(popped);
  }
  // The same launch for a kernel whose only argument is the 176-byte FmhaParams (simt), against
  // wgmma's params + four 128-byte tensor maps + schedule: what the argument block costs.
  const Variant simt =
      detail::variant_of(detail::family_named("simt", "family"), engine.device().arch, DType::bf16,
                         head_dim, false, {64, 64, 1});
  const auto simt_kernel = store.get(simt, detail::kernel_spec(simt));
  const CUfunction simt_function =
      modules
          .get(engine.context(), {simt_kernel->key, simt_kernel->cubin, simt_kernel->lowered_name,
                                  simt_kernel->entry.dynamic_shared_bytes})
          .function;
  const detail::LaunchPlan simt_plan =
      detail::family_named("simt", "family").plan(simt, problem, engine.device());
  const CUlaunchConfig simt_config = detail::launch_config(simt_plan, created);
  void* simt_args[] = {const_cast<FmhaParams*>(&problem.params)};
  row("cuLaunchKernelEx alone, simt kernel (params only)",
      [&] { last = cu.cuLaunchKernelEx(&simt_config, simt_function, simt_args, nullptr); });
  fmt::print("  (result {})\n", static_cast<int>(last));
  row("cuLaunchKernel alone, simt kernel (params only)", [&] {
    last = cu.cuLaunchKernel(simt_function, simt_config.gridDimX, simt_config.gridDimY,
                             simt_config.gridDimZ, simt_config.blockDimX, 1, 1,
                             simt_config.sharedMemBytes, created, simt_args, nullptr);
  });
  fmt::print("  (result {})\n", static_cast<int>(last));
  row("cuLaunchKernel alone, wgmma kernel, fixed arguments", [&] {
    last = cu.cuLaunchKernel(function, config.gridDimX, config.gridDimY, config.gridDimZ,
                             config.blockDimX, 1, 1, config.sharedMemBytes, created,
                             fixed_args.data(), nullptr);
  });
  fmt::print("  (result {})\n", static_cast<int>(last));
  // One CTA of the simt kernel: the GPU finishes each launch at once, so no queue builds up.
  row("cuLaunchKernel alone, simt kernel, one CTA", [&] {
    last = cu.cuLaunchKernel(simt_function, 1, 1, 1, simt_config.blockDimX, 1, 1,
                             simt_config.sharedMemBytes, created, simt_args, nullptr);
  });
  fmt::print("  (result {})\n", static_cast<int>(last));

  // A warm backward (bwd_prep, the dK/dV kernel, the dQ finish): its whole host time, which
  // its launch plans (made once per layout) keep to validation, one lookup and the launches.
  DeviceBuffer dout(engine, bytes), dq(engine, bytes), dk(engine, bytes), dv(engine, bytes);
  DeviceBuffer lse(engine, std::size_t{4} * batch * heads * seqlen);
  for (DeviceBuffer* b : {&o, &dout, &lse}) b->fill_bytes(0x3c);  // finite, small
  const BackwardOptions backward_options;
  auto backward = [&] {
    engine.backward(view(q), view(k), view(v), view(o), view(dout),
                    static_cast<const float*>(lse.data()), view(dq), view(dk), view(dv),
                    backward_options, created);
  };
  for (int i = 0; i < 10; ++i) backward();
  synchronize(engine);
  row("backward, created stream (context current), 3 launches", backward);
  return 0;
}

#include "cuda/launch.hpp"

#include <fmt/format.h>

#include "cuda/driver.hpp"
#include "flashjit/flashjit.hpp"

namespace flashjit::detail {
namespace {

// A refused launch names what it asked for beside what the kernel allows: the driver's code
// alone (often CUDA_ERROR_INVALID_VALUE) does not say which of them was wrong.
[[noreturn]] void throw_launch_error(CUresult result, CUfunction function,
                                     const CUlaunchConfig& config) {
  const DriverApi& cu = driver();
  int max_threads = 0, max_dynamic_shared = 0, static_shared = 0;
  const bool known =
      cu.cuFuncGetAttribute(&max_threads, CU_FUNC_ATTRIBUTE_MAX_THREADS_PER_BLOCK, function) ==
          CUDA_SUCCESS &&
      cu.cuFuncGetAttribute(&max_dynamic_shared, CU_FUNC_ATTRIBUTE_MAX_DYNAMIC_SHARED_SIZE_BYTES,
                            function) == CUDA_SUCCESS &&
      cu.cuFuncGetAttribute(&static_shared, CU_FUNC_ATTRIBUTE_SHARED_SIZE_BYTES, function) ==
          CUDA_SUCCESS;
  std::string message = fmt::format(
      "{}: grid ({}, {}, {}), block ({}, {}, {}), {} bytes of dynamic shared memory",
      describe(result, "cuLaunchKernelEx"), config.gridDimX, config.gridDimY, config.gridDimZ,
      config.blockDimX, config.blockDimY, config.blockDimZ, config.sharedMemBytes);
  if (known)
    message += fmt::format(
        "; the kernel allows {} threads a block and {} bytes of dynamic shared memory ({} static)",
        max_threads, max_dynamic_shared, static_shared);
  throw Error(ErrorCode::cuda_error, message);
}

void* operand_address(const FmhaParams& params, MapOperand operand) {
  switch (operand) {
    case MapOperand::q: return const_cast<void*>(params.q);
    case MapOperand::k: return const_cast<void*>(params.k);
    case MapOperand::v: return const_cast<void*>(params.v);
    case MapOperand::o: return params.o;
    case MapOperand::dout:  // only backward kernels read dO
    case MapOperand::none: break;
  }
  return nullptr;
}

void* operand_address(const BackwardParams& params, MapOperand operand) {
  return operand == MapOperand::dout ? const_cast<void*>(params.dout)
                                     : operand_address(params.fwd, operand);
}

// Appends the plan's plain values to `args` (count so far) and launches.
void launch_with_args(CUfunction function, const LaunchPlan& plan, void** args, std::size_t count,
                      CUstream stream) {
  const DriverApi& cu = driver();
  for (const auto& value : plan.values) args[count++] = const_cast<std::byte*>(value.data());

  CUlaunchConfig config = launch_config(plan, stream);
  CUlaunchAttribute overlap{};
  if (plan.overlaps_previous) {
    overlap.id = CU_LAUNCH_ATTRIBUTE_PROGRAMMATIC_STREAM_SERIALIZATION;
    overlap.value.programmaticStreamSerializationAllowed = 1;
    config.attrs = &overlap;
    config.numAttrs = 1;
  }
  const CUresult result = cu.cuLaunchKernelEx(&config, function, args, nullptr);
  if (result != CUDA_SUCCESS) throw_launch_error(result, function, config);
}

template <typename Params>
void launch_with_maps(CUfunction function, const LaunchPlan& plan, const Params& params,
                      CUstream stream) {
  const DriverApi& cu = driver();
  CUtensorMap maps[LaunchPlan::kMaxMaps];
  void* args[1 + LaunchPlan::kMaxMaps + LaunchPlan::kMaxValues];
  std::size_t count = 0;
  args[count++] = const_cast<Params*>(&params);
  for (std::size_t i = 0; i < plan.maps.size(); ++i) {
    maps[i] = plan.maps[i].map;
    if (plan.maps[i].operand != MapOperand::none)
      check(cu.cuTensorMapReplaceAddress(&maps[i], operand_address(params, plan.maps[i].operand)),
            "cuTensorMapReplaceAddress");
    args[count++] = &maps[i];
  }
  launch_with_args(function, plan, args, count, stream);
}

}  // namespace

CUlaunchConfig launch_config(const LaunchPlan& plan, CUstream stream) {
  CUlaunchConfig config{};
  config.gridDimX = plan.grid[0];
  config.gridDimY = plan.grid[1];
  config.gridDimZ = plan.grid[2];
  config.blockDimX = plan.block[0];
  config.blockDimY = plan.block[1];
  config.blockDimZ = plan.block[2];
  config.sharedMemBytes = plan.shared_bytes;
  config.hStream = stream;
  return config;
}

void launch(CUfunction function, const LaunchPlan& plan, const FmhaParams& params,
            CUstream stream) {
  launch_with_maps(function, plan, params, stream);
}

void launch(CUfunction function, const LaunchPlan& plan, const MergeParams& params,
            CUstream stream) {
  void* args[1 + LaunchPlan::kMaxValues];
  std::size_t count = 0;
  args[count++] = const_cast<MergeParams*>(&params);
  launch_with_args(function, plan, args, count, stream);
}

void launch(CUfunction function, const LaunchPlan& plan, const BackwardParams& params,
            CUstream stream) {
  launch_with_maps(function, plan, params, stream);
}

}  // namespace flashjit::detail

// A kernel launch prepared once per (kernel, shape, strides) and issued per call with only the
// base pointers of that call patched in: the hot path computes nothing else.
#pragma once

#include <cuda.h>

#include <array>
#include <cstddef>
#include <vector>

#include "common/params.cuh"
#include "flashjit/flashjit.hpp"

namespace flashjit::detail {

// The tensor of FmhaParams (dout: of BackwardParams) a tensor map addresses; none: the kernel
// never reads the map (zeros).
enum class MapOperand { none, q, k, v, o, dout };

struct TensorMapArg {
  CUtensorMap map{};  // encoded for the shape and strides, at some call's addresses
  MapOperand operand = MapOperand::none;
};

struct LaunchPlan {
  static constexpr std::size_t kMaxMaps = 4;  // the most a kernel takes (wgmma: q, k, v, o)
  static constexpr std::size_t kMaxValues = 4;

  std::array<unsigned, 3> grid{1, 1, 1};
  std::array<unsigned, 3> block{1, 1, 1};
  unsigned shared_bytes = 0;
  // Kernel arguments after FmhaParams, in order: the tensor maps, then plain values.
  std::vector<TensorMapArg> maps;
  std::vector<std::vector<std::byte>> values;
  // Programmatic dependent launch: the kernel may be launched while the stream's previous kernel
  // is still finishing (every kernel waits for it first: common/grid_dependency.cuh).
  bool overlaps_previous = false;
  // The kernel takes its work units from FmhaParams::tile_counter, which the engine points at its
  // counter for the launch's stream (or leaves null: the kernel's static order).
  bool takes_tile_counter = false;
};

// Whether kernels on `device` launch under the previous kernel's tail (griddepcontrol: sm_90 on).
inline bool may_overlap_previous(const DeviceInfo& device) { return device.cc_major >= 9; }

// The plan's grid, block and shared memory as the driver's launch configuration on `stream`.
CUlaunchConfig launch_config(const LaunchPlan& plan, CUstream stream);

// Launches `function` on `stream` with `params`; the plan's maps are given this call's base
// addresses (cuTensorMapReplaceAddress on a copy). Throws Error(cuda_error).
void launch(CUfunction function, const LaunchPlan& plan, const FmhaParams& params, CUstream stream);
// The same for kernels taking MergeParams (plans without tensor maps) or BackwardParams (maps
// over params.fwd's tensors and dout).
void launch(CUfunction function, const LaunchPlan& plan, const MergeParams& params,
            CUstream stream);
void launch(CUfunction function, const LaunchPlan& plan, const BackwardParams& params,
            CUstream stream);

}  // namespace flashjit::detail

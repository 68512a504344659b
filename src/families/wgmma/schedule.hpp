// The wgmma family's tile schedule (kernels_src/wgmma/schedule.cuh walks it): the query tiles and
// work units of a launch, whether its CTAs take single causal tiles from the engine's counter,
// and the persistent grid. No driver call, so the CPU tests check it.
#pragma once

#include "core/problem.hpp"
#include "flashjit/flashjit.hpp"
#include "wgmma/shape.cuh"

namespace flashjit::detail {

struct WgmmaLaunchSchedule {
  WgmmaSchedule schedule;  // passed to the kernel by value
  unsigned ctas;           // the persistent grid: one CTA an SM at most
  // The kernel takes its units from FmhaParams::tile_counter where the engine gives one
  // (schedule.lpt_group_pairs > 0).
  bool takes_tile_counter;
};

WgmmaLaunchSchedule wgmma_schedule(const Variant& v, const ForwardProblem& problem,
                                   const DeviceInfo& device);

}  // namespace flashjit::detail

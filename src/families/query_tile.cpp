#include "families/query_tile.hpp"

#include "core/arch.hpp"

namespace flashjit::detail {

LaunchPlan query_tile_plan(const Variant& variant, const ForwardProblem& problem, int threads,
                           int shared_bytes) {
  LaunchPlan plan;
  plan.grid = {static_cast<unsigned>((problem.seqlen_q + variant.tile_m - 1) / variant.tile_m),
               static_cast<unsigned>(problem.heads_q), static_cast<unsigned>(problem.batch)};
  plan.block = {static_cast<unsigned>(threads), 1, 1};
  plan.shared_bytes = static_cast<unsigned>(shared_bytes);
  return plan;
}

std::string runs_every_problem(const ForwardProblem&) { return {}; }

bool runs_on_sm80_or_later(std::string_view arch) { return arch_number(arch) >= 80; }

}  // namespace flashjit::detail

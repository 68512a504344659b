// Kernel families: for each kernel template, how to name it for NVRTC, which variants are valid,
// which tile config the dispatcher picks per arch, and how a launch is shaped.
#pragma once

#include <array>
#include <climits>
#include <cstddef>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "flashjit/flashjit.hpp"
#include "problem.hpp"

namespace flashjit::detail {

// A family's tile choice for one (arch, head_dim, causal): the first rule whose max_seqlen_k covers
// the problem's key length wins; the last rule covers any length. Short sequences may want smaller
// key tiles (less padding in the last one), long ones the shape with the best steady state.
struct TileTable {
  struct Rule {
    int max_seqlen_k;
    TileConfig tiles;
  };
  static constexpr int kMaxRules = 4;
  std::array<Rule, kMaxRules> rules{};
  int count = 0;

  // One shape for every length.
  static TileTable single(TileConfig tiles) { return {{Rule{INT_MAX, tiles}}, 1}; }
  TileConfig pick(int seqlen_k) const;
};

struct LaunchPlan {
  std::array<unsigned, 3> grid{1, 1, 1};
  std::array<unsigned, 3> block{1, 1, 1};
  unsigned shared_bytes = 0;
  // By-value kernel arguments after FmhaParams (e.g. TMA descriptors), in order.
  std::vector<std::vector<std::byte>> extra_args;
};

struct FamilyTraits {
  Family family;
  std::string_view source_file;      // under kernels_src/
  std::string_view kernel_template;  // C++ name of the __global__ template
  std::vector<int> head_dims;        // head dims with a tuned default
  bool (*runs_on)(std::string_view arch);
  // Empty when the variant's fields fit this family, else what is wrong.
  std::string (*check)(const Variant& variant);
  int (*threads)(const Variant& variant);
  int (*shared_bytes)(const Variant& variant);
  // The dispatcher's per-arch tile table for this family.
  TileTable (*tile_table)(std::string_view arch, int head_dim, bool causal);
  // Empty when the family can run this problem, else why not (logged when falling back).
  std::string (*unsupported_reason)(const ForwardProblem& problem);
  LaunchPlan (*plan)(const Variant& variant, const ForwardProblem& problem);
};

const FamilyTraits& family_traits(Family family);
// Families in order of preference (fastest first).
const std::vector<const FamilyTraits*>& all_families();
std::optional<Family> family_from_name(std::string_view name);

// "flashjit::fmha_simt_kernel<flashjit::bf16, 128, 64, 64, 1, true>"
std::string name_expression(const Variant& variant);
// Throws Error(invalid_argument) when the variant cannot be built.
void check_variant(const Variant& variant);

// The launch of the non-persistent families (simt, mma): one CTA per (query tile, head, batch).
LaunchPlan query_tile_plan(const Variant& variant, const ForwardProblem& problem, int threads,
                           int shared_bytes);
// unsupported_reason of a family that runs every valid problem.
std::string runs_every_problem(const ForwardProblem& problem);
// For families whose kernels need only sm_80 features (cp.async, mma.sync, bf16 conversions).
bool runs_on_sm80_or_later(std::string_view arch);

}  // namespace flashjit::detail

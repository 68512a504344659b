// What a kernel family registers (once, in registry.cpp): its name and head dims, where it runs,
// which variants it can build, the tiles the dispatcher picks, and how a launch is shaped. A
// family's geometry comes from its kernels_src/<family>/shape.cuh, shared with the kernel.
#pragma once

#include <array>
#include <climits>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "core/problem.hpp"
#include "cuda/launch.hpp"
#include "flashjit/flashjit.hpp"

namespace flashjit::detail {

// A family's tile choice for one (arch, head_dim, causal, paged): the first rule whose limits all
// cover the problem wins; the last rule covers any problem. Short sequences may want smaller key
// tiles (less padding in the last one), long ones the shape with the best steady state.
struct TileTable {
  struct Rule {
    int max_seqlen_k;
    TileConfig tiles;
    // Query rows per KV head (seqlen_q * heads_q / heads_kv) the rule covers: the decode family
    // sizes its tile by them.
    int max_rows_per_kv_head = INT_MAX;
    // Rows per page of a paged cache the rule covers (a dense cache passes any): small pages may
    // want short key tiles.
    int max_page_size = INT_MAX;
  };
  static constexpr int kMaxRules = 5;
  std::array<Rule, kMaxRules> rules{};
  int count = 0;

  // One shape for every problem.
  static TileTable single(TileConfig tiles) { return {{Rule{INT_MAX, tiles}}, 1}; }
  TileConfig pick(const ForwardProblem& problem) const;
};

// What a family computes: attention forward (the dispatcher chooses among these), the merge of
// partial results (split-KV, Engine::merge_attention_states), block masks
// (Engine::create_block_mask), or a part of Engine::backward: dK and dV (backward chooses among
// these; BackwardOptions::family), dQ alone (its deterministic mode), or the row passes before
// and after them. Forward dispatches only to the first.
enum class FamilyRole { attention, merge, block_mask, backward, backward_dq, backward_rows };

// Problem features beyond dense, equal-length attention; a family lists those it handles, and the
// dispatcher and the variant check refuse the others.
enum FamilyFeature : unsigned {
  kFeaturePagedKv = 1u << 0,   // KVCache::paged (and the variant's paged flag)
  kFeatureSeqUsedK = 1u << 1,  // KVCache::seqused_k
  kFeatureSplitKv = 1u << 2,   // ForwardOptions::num_splits > 1
  kFeatureVarlen = 1u << 3,    // VarlenBatch (packed sequences of different lengths)
  kFeatureSoftcap = 1u << 4,   // ForwardOptions::softcap (Variant::softcap)
  kFeatureWindow = 1u << 5,    // ForwardOptions::window_left / window_right (Variant::window)
  kFeatureSink = 1u << 6,      // ForwardOptions::sink_logits (Variant::sink)
  kFeatureAlibi = 1u << 7,     // ForwardOptions::alibi_slopes (Variant::alibi)
  // ForwardOptions::user_functions (Variant::user_functions): score_mod / mask_mod compiled in.
  kFeatureUserFunctions = 1u << 8,
  // ForwardOptions / BackwardOptions::block_mask (with a mask_mod): the kernel template ends with
  // `bool BlockMask`, and a variant with a mask_mod compiles the entry with it true beside the
  // other (KernelSpec::block_mask_name_expression), launched when a block mask is given.
  kFeatureBlockMask = 1u << 9,
};
// What the backward's dK/dV and dQ kernels build variants of (BackwardOptions, VarlenBatch).
// Learnable sinks need no variant there: the forward's LSE holds them (bwd_sink gives their
// gradient). Block masks (BackwardOptions::block_mask) need none either: the kernels with a
// mask_mod have an entry that reads one (kernels_src/common/bwd_block_mask.cuh).
constexpr unsigned kBackwardVariantFeatures = kFeatureVarlen | kFeatureSoftcap | kFeatureWindow |
                                              kFeatureAlibi | kFeatureUserFunctions |
                                              kFeatureBlockMask;

// Registrations are constant-initialized (constinit, see each family's file): a Variant parsed
// during another file's static initialization already finds every family.
struct KernelFamily {
  FamilyRole role = FamilyRole::attention;
  unsigned features = 0;             // FamilyFeature bits
  std::string_view name;             // the first field of its variant names
  std::string_view summary;          // one line for families() and `flashjit info`
  std::string_view source_file;      // its kernel under kernels_src/
  std::string_view kernel_template;  // C++ name of the __global__ template
  std::span<const int> head_dims;    // head dims it has kernels (and a tile table) for
  bool (*runs_on)(std::string_view arch);
  // Empty when the tile fields (tile_m, tile_n, stages) fit this family, else what is wrong.
  // Arch and head dim are checked by the registry before this is called.
  std::string (*check_tiles)(const Variant& variant);
  int (*shared_bytes)(const Variant& variant);
  // paged: the problem reads a paged KV cache (families with kFeaturePagedKv may tile it apart).
  TileTable (*tile_table)(std::string_view arch, int head_dim, bool causal, bool paged);
  // Empty when the family can run this problem, else why not (logged when falling back).
  std::string (*unsupported_reason)(const ForwardProblem& problem);
  // The launch for a problem; its tensor maps are encoded at the problem's addresses and later
  // calls patch only those (src/cuda/launch.hpp).
  // Attention families only (null for the merge family).
  LaunchPlan (*plan)(const Variant& variant, const ForwardProblem& problem,
                     const DeviceInfo& device);
  // Backward families whose launch depends on the gradients' layout too (tensor maps over dO):
  // the plan from the forward problem and the backward's params (dO's pointer and strides),
  // encoded at these params' addresses like `plan`'s maps. Null: `plan` serves.
  LaunchPlan (*backward_plan)(const Variant& variant, const ForwardProblem& problem,
                              const BackwardParams& params, const DeviceInfo& device) = nullptr;
  // Template arguments after the element type, e.g. "128, 64, 64, 2, false"; null: the common
  // (head_dim, tile_m, tile_n, stages, causal, softcap, window, sink, alibi), then varlen for
  // families with varlen_variants.
  std::string (*template_arguments)(const Variant& variant) = nullptr;
  // True: per-sequence lengths (varlen batches, seqused_k) are compiled into variants of their own
  // (Variant::varlen), so dense batches run kernels without that code.
  bool varlen_variants = false;
  // Backward dK/dV families that also add dQ into the fp32 accumulator with atomics in every
  // mode (bwd_convert finishes it): never chosen for BackwardOptions::deterministic.
  bool always_accumulates_dq = false;
  // Backward dK/dV families that add dQ up in 64 x 64 blocks of a wgmma accumulator's register
  // order (BwdDqBlocks; BackwardParams::dq_accum_blocks tells bwd_convert), not row-major.
  bool dq_accumulator_blocks = false;
  // Split-KV families: how many splits a problem gets on this GPU (problem.num_splits, when set,
  // was already checked and wins). Null: never splits.
  int (*num_splits)(const Variant& variant, const ForwardProblem& problem,
                    const DeviceInfo& device) = nullptr;
};

}  // namespace flashjit::detail

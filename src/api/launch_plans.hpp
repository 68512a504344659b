// The hot path's memory: for each (context, sizes, strides, options) a forward has seen, the
// kernel to launch and its launch plan (tensor maps encoded once). A warm forward validates,
// looks up one key of plain values (no strings formatted, no driver queried) and launches.
#pragma once

#include <cuda.h>

#include <array>
#include <atomic>
#include <cstdint>
#include <memory>
#include <optional>
#include <shared_mutex>
#include <type_traits>
#include <unordered_map>

#include "core/problem.hpp"
#include "cuda/launch.hpp"
#include "cuda/modules.hpp"
#include "families/family.hpp"
#include "jit/compiled_kernel.hpp"

namespace flashjit::detail {

struct PlanKey {
  CUcontext context = nullptr;
  const KernelFamily* forced_family = nullptr;
  std::array<std::int64_t, 13> strides{};  // q, k, v, o: batch, seqlen, heads; the page table's
  std::array<std::int32_t, 6> sizes{};     // batch, heads_q, heads_kv, seqlen_q, seqlen_k, head_dim
  std::int32_t dtype = 0, causal = 0;
  std::int32_t paged = 0, page_size = 0, num_pages = 0, has_seqused = 0, num_splits = 0;
  std::int32_t varlen = 0, total_q = 0, total_k = 0;
  std::int32_t tile_m = 0, tile_n = 0, stages = 0;  // forced tiles; 0: the family's table
  std::int32_t softcap = 0;  // 1: soft-capped (its value is a run-time parameter, not the key's)
  std::int32_t window = 0;   // 1: a sliding window
  // The window's sides and sink tokens (FmhaParams, 0 without a window): run-time parameters of
  // the kernel, but split-KV's plan (num_splits, split_tiles) counts the tiles they span.
  std::int32_t window_left = 0, window_right = 0, sink_tokens = 0;
  std::int32_t sink = 0;   // 1: attention sinks (their logits are run-time parameters)
  std::int32_t alibi = 0;  // 1: ALiBi (its slopes are run-time parameters); the int32s stay even
                           // in number: no padding (the key is hashed as bytes)
  std::array<std::uint64_t, 2> user_functions{};  // their hash (user_functions_key); 0: none

  static PlanKey of(CUcontext context, const ForwardProblem& problem,
                    const KernelFamily* forced_family, const std::optional<TileConfig>& tiles);
  bool operator==(const PlanKey&) const = default;
};

// A background compile an engine started (never-block mode), as the launches that stand in for
// its variant see it.
struct BackgroundCompile {
  std::atomic<bool> done{false};    // finished, compiled or failed
  std::atomic<bool> failed{false};  // its stand-in stays for good
};

// A second kernel after the attention one: the merge of split-KV partials.
struct MergeLaunch {
  std::shared_ptr<const CompiledKernel> kernel;
  CUfunction function = nullptr;
  LaunchPlan plan;
};

// A compiled kernel and its functions in one context (the kernel owns what they came from).
struct KernelHandle {
  std::shared_ptr<const CompiledKernel> kernel;
  CUfunction function = nullptr;
  CUfunction block_mask_function = nullptr;  // its entry that reads a block mask, if it has one

  // The entry a launch runs: the block-mask one where the launch's params carry a block mask.
  CUfunction entry(bool reads_block_mask) const;
  // Takes the functions of `kernel`'s module as loaded in a context.
  void use(const LoadedKernel& module) {
    function = module.function;
    block_mask_function = module.block_mask_function;
  }
};

struct ReadyLaunch : KernelHandle {  // the kernel to launch (`kernel` owns what it came from)
  Variant variant;
  // Split-KV: the attention kernel writes num_splits partials of split_tiles key tiles each into
  // a workspace of workspace_bytes (partial outputs, then at lse_offset their LSEs), and `merge`
  // combines them. num_splits 1: no workspace, no merge.
  int num_splits = 1;
  int split_tiles = 0;
  std::size_t workspace_bytes = 0;
  std::size_t lse_offset = 0;
  std::optional<MergeLaunch> merge;
  // Set while this launch stands in for a variant that compiles in the background: once that is
  // done, the next call plans again (and finds the compiled kernel).
  std::shared_ptr<const BackgroundCompile> stand_in_for;
  LaunchPlan plan;
};

// The bytes of a key with no padding (has_unique_object_representations), hashed.
std::size_t hash_key_bytes(const void* key, std::size_t size);

// Plans by key, for the hot path: a find under a shared lock, inserted once per key. Keeps at
// most kMaxPlans; past that the map starts over (shapes that vary call by call).
template <typename Key, typename Plan>
class PlanMap {
  static_assert(std::has_unique_object_representations_v<Key>, "keys are hashed as bytes");

 public:
  std::shared_ptr<const Plan> find(const Key& key) const {
    std::shared_lock lock(mutex_);
    const auto it = plans_.find(key);
    return it == plans_.end() ? nullptr : it->second;
  }
  void insert(const Key& key, std::shared_ptr<const Plan> plan) {
    std::unique_lock lock(mutex_);
    if (plans_.size() >= kMaxPlans) plans_.clear();
    plans_.insert_or_assign(key, std::move(plan));
  }

  static constexpr std::size_t kMaxPlans = 4096;

 private:
  struct Hash {
    std::size_t operator()(const Key& key) const { return hash_key_bytes(&key, sizeof(key)); }
  };
  mutable std::shared_mutex mutex_;
  std::unordered_map<Key, std::shared_ptr<const Plan>, Hash> plans_;
};

using LaunchPlans = PlanMap<PlanKey, ReadyLaunch>;

}  // namespace flashjit::detail

// What the forward and backward halves of flashjit_every_variant share: the problems, the
// run-time parameters of the score variants, and the backward half's entry point.
#pragma once

#include <fmt/format.h>

#include <random>
#include <string>
#include <vector>

#include "flashjit/device_memory.hpp"
#include "flashjit/flashjit.hpp"

namespace flashjit::every_variant {

struct Problem {
  int batch, heads_q, heads_kv, seqlen_q, seqlen_k;
  bool bhsd;
};

// Not tile multiples on either side; seqlen_q > seqlen_k in the second gives causal rows that see
// no key; the third is a single query and key. Small, because racecheck slows every launch down a
// hundredfold or more.
inline constexpr Problem kProblems[] = {
    {1, 4, 2, 70, 133, false},
    {2, 3, 1, 129, 65, true},
    {1, 2, 2, 1, 1, false},
};

inline std::string describe(const Problem& p) {
  return fmt::format("b{} hq{} hkv{} sq{} sk{} {}", p.batch, p.heads_q, p.heads_kv, p.seqlen_q,
                     p.seqlen_k, p.bhsd ? "bhsd" : "bshd");
}

// `values` in a new device buffer of `buffers`, which keeps it alive until after the launches.
template <typename T>
const T* upload(const Engine& engine, const std::vector<T>& values,
                std::vector<DeviceBuffer>& buffers) {
  buffers.emplace_back(engine, values.size() * sizeof(T));
  buffers.back().upload(values.data(), values.size() * sizeof(T));
  return static_cast<const T*>(buffers.back().data());
}

// The run-time parameters of a variant's score variants (soft-cap, window, learnable sinks,
// ALiBi): one set for a forward and the backward of its output.
struct ScoreParams {
  float softcap = 0.f;
  int window_left = -1, window_right = -1, sink_tokens = 0;
  const float* sink_logits = nullptr;
  const float* alibi_slopes = nullptr;

  // Into ForwardOptions or BackwardOptions (the same field names).
  template <typename Options>
  void apply(Options& options) const {
    options.softcap = softcap;
    options.window_left = window_left;
    options.window_right = window_right;
    options.sink_tokens = sink_tokens;
    options.sink_logits = sink_logits;
    options.alibi_slopes = alibi_slopes;
  }
};

// Those the variant's flags ask for, with learnable sinks when `sinks` (a backward variant has no
// sink flag: the LSE holds them); the device arrays go to `buffers`.
ScoreParams score_params(const Engine& engine, const Variant& variant, bool sinks, int heads_q,
                         std::vector<DeviceBuffer>& buffers);

struct Tally {
  int launches = 0, failures = 0;
};

// Launches the backward variants `asked` (FamilyInfo::backward; every_variant_backward.cpp), with
// `every` (all backward variants of the run's twins, whatever the family prefix) to draw on for
// helper variants that no asked dK/dV variant runs. Failures are printed.
Tally run_backward(Engine& engine, const std::vector<Variant>& asked,
                   const std::vector<Variant>& every, std::mt19937& rng);

}  // namespace flashjit::every_variant

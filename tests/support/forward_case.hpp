// One forward problem run on the GPU and checked against the float64 reference.
#pragma once

#include <optional>
#include <string>
#include <vector>

#include "compare.hpp"
#include "device_problem.hpp"
#include "flashjit/flashjit.hpp"
#include "reference.hpp"

namespace flashjit::test {

struct ForwardCase {
  int batch = 1, heads_q = 1, heads_kv = 1, seqlen_q = 1, seqlen_k = 1, head_dim = 64;
  bool causal = false;
  DType dtype = DType::bf16;
  bool bhsd = false;
  bool with_lse = true;
  float softcap = 0.f;       // ForwardOptions::softcap
  int window_left = -1, window_right = -1;  // ForwardOptions::window_* (-1: unbounded)
  int sink_tokens = 0;                      // ForwardOptions::sink_tokens
  std::vector<float> sink_logits;  // ForwardOptions::sink_logits, one per query head; empty: none
  std::vector<float> alibi_slopes;  // ForwardOptions::alibi_slopes, one per query head; empty: none
  double input_scale = 1.0;  // standard deviation of the random q and k (large: capped scores)
  std::string describe() const;
};

// Fresh random q, k (standard deviation input_scale) and v (1), seeded by `seed`, on the device
// with a poisoned output.
DeviceProblem random_problem(const Engine& engine, const ForwardCase& c, unsigned seed);
// The case's softcap, window, sink tokens, sinks and ALiBi as the float64 reference takes them.
ScoreMods score_mods(const ForwardCase& c);

struct ForwardCheck : ForwardErrors {
  std::string variant;
};

// Fresh random inputs (seeded by `seed`), poisoned output, forward, compare.
// `tiles` forces a tile shape (every variant of a seqlen-keyed tile table on one small problem).
ForwardCheck run_forward_case(Engine& engine, const ForwardCase& c,
                              std::optional<std::string> family, unsigned seed,
                              std::optional<TileConfig> tiles = {});

// run_forward_case for one family, or nullopt when it cannot run: a visible MESSAGE for
// Error(unsupported), a failed check for any other error.
std::optional<ForwardCheck> run_if_supported(Engine& engine, const ForwardCase& c,
                                             const std::string& family, unsigned seed);

// Asserts every bound of compare.hpp (doctest CHECK), naming the ones that fail.
void check_within_bounds(const ForwardErrors& errors, DType dtype);

// A variant (softcap, window, sinks, ALiBi) in every family on this GPU that runs it: each case first
// as `plain` makes it (the variant off: its launch plan is cached, and must not serve the
// variant's call, whose name must not end with `suffix`), then as given (its name ends with
// `suffix`, and it is within the reference bounds). Seeds count up from `seed`. Returns how many
// variant runs launched.
int check_variant_against_plain(const std::vector<ForwardCase>& cases, const std::string& suffix,
                                ForwardCase (*plain)(ForwardCase), unsigned seed);

}  // namespace flashjit::test

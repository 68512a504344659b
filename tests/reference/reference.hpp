// Host-side attention in float64: the ground truth for GPU tests. Inputs are bf16/fp16 bit
// patterns in strided [b, s, h, d] layouts, the same views the engine takes.
#pragma once

#include <cstddef>
#include <cstdint>
#include <functional>
#include <random>
#include <vector>

#include "flashjit/flashjit.hpp"

namespace flashjit::test {

// Host copy of one tensor: 16-bit values plus the view's shape and strides (data unset).
struct HostTensor {
  TensorView view;  // data == nullptr; shape/stride describe `bits`
  std::vector<std::uint16_t> bits;

  static HostTensor make(DType dtype, std::int64_t b, std::int64_t s, std::int64_t h,
                         std::int64_t d, bool bhsd);
  std::int64_t offset(std::int64_t b, std::int64_t s, std::int64_t h, std::int64_t d) const;
  double at(std::int64_t b, std::int64_t s, std::int64_t h, std::int64_t d) const;
  void fill_random(std::mt19937& rng, double scale = 1.0);
  void fill(std::uint16_t pattern);
  std::size_t bytes() const { return bits.size() * sizeof(std::uint16_t); }  // of `bits`
};

float to_float(DType dtype, std::uint16_t bits);
std::uint16_t from_float(DType dtype, float value);

struct Reference {
  std::vector<double> out;  // [b, sq, hq, d] contiguous
  std::vector<double> lse;  // [b, hq, sq]; -inf for rows with no visible key (and no sink)
};

using HostScoreMod =
    std::function<double(double score, int batch, int head, int q_idx, int kv_idx)>;
using HostMaskMod = std::function<bool(int batch, int head, int q_idx, int kv_idx)>;

// Score modifications and masks beyond causal, in FlashAttention's conventions. Positions are
// bottom-right aligned: query i of sq sits at key position i' = i + sk - sq.
struct ScoreMods {
  // Sliding window: key j is visible iff i' - window_left <= j <= i' + window_right; -1 leaves a
  // side unbounded. Causal caps window_right at 0.
  int window_left = -1, window_right = -1;
  // StreamingLLM: the first sink_tokens keys stay visible whatever the window (not past causal).
  int sink_tokens = 0;
  // > 0: scores become softcap * tanh(s / softcap), s = softmax_scale * q·k, before ALiBi and
  // the masks.
  double softcap = 0;
  // Per query head (empty: none): s -= slope * |i' - j|.
  std::vector<double> alibi_slopes;
  // Per query head (empty: none): one more logit in each row's softmax denominator, with no value
  // (gpt-oss). It enters the LSE; a row with no visible key gets output 0 and LSE = the sink.
  std::vector<double> sink_logits;
  // Host mirrors of user functions (ForwardOptions::user_functions; empty: none). score_mod takes
  // the score after softmax_scale, softcap and ALiBi (natural-log units) and its result goes on to
  // the masks and the softmax; mask_mod false hides key kv_idx from query q_idx, on top of the
  // causal and window masks. q_idx and kv_idx are row indices of q and k (not aligned), head the
  // query head, batch first_batch + the batch index of the tensors.
  HostScoreMod score_mod;
  HostMaskMod mask_mod;
  // d score_mod / d score, for the backward reference (needed there with a score_mod).
  HostScoreMod score_mod_grad;
  // The batch the user functions see for batch 0: a per-sequence reference (one sequence at a
  // time, reference_per_sequence, HostVarlen::reference) passes each sequence's own.
  int first_batch = 0;
};

Reference reference_attention(const HostTensor& q, const HostTensor& k, const HostTensor& v,
                              double softmax_scale, bool causal, const ScoreMods& mods = {});

// Whether query position `at` (bottom-right aligned: row i of sq at i + sk - sq) sees key j
// under the causal and window masks and the sink tokens (not mask_mod).
bool visible_by_masks(const ScoreMods& mods, bool causal, std::int64_t at, std::int64_t j);

}  // namespace flashjit::test

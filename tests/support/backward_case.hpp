// One backward problem run on the GPU, as training runs it (forward with LSE, then backward
// from a random dout), and checked against the float64 reference gradients.
#pragma once

#include <array>
#include <optional>
#include <string>
#include <vector>

#include "compare_backward.hpp"
#include "device_problem.hpp"
#include "flashjit/device_memory.hpp"
#include "flashjit/flashjit.hpp"
#include "poisoned_output.hpp"
#include "reference.hpp"
#include "reference_backward.hpp"

namespace flashjit::test {

struct BackwardCase {
  int batch = 1, heads_q = 1, heads_kv = 1, seqlen_q = 1, seqlen_k = 1, head_dim = 64;
  bool causal = false;
  DType dtype = DType::bf16;
  bool bhsd = false;
  std::optional<float> softmax_scale;  // the forward's and BackwardOptions'; default 1/sqrt(d)
  bool deterministic = false;          // BackwardOptions::deterministic
  std::optional<TileConfig>
      tiles;  // BackwardOptions::tiles (the dK/dV kernel's); default: its table
  // The forward's score variants (ForwardOptions' meaning), given to both passes.
  float softcap = 0.f;
  int window_left = -1, window_right = -1, sink_tokens = 0;
  bool alibi = false;  // slopes 2^(-8 (h + 1) / heads_q), as BLOOM's
  bool sinks = false;  // learnable sink logits per head; their gradient is checked too
  // User functions given to both passes (the caller keeps them and what user_args point to
  // alive), and their host mirrors for the reference (ScoreMods' meaning).
  const UserFunctions* user_functions = nullptr;
  std::array<const void*, kMaxUserArgs> user_args{};
  HostScoreMod score_mod, score_mod_grad;
  HostMaskMod mask_mod;
  std::string describe() const;
  double scale() const;  // the softmax scale in effect
  ScoreMods mods() const;  // the variants as the reference takes them
};

// The device tensors of one case: seeded random q, k, v and dout; out and lse from
// Engine::forward (run in the constructor); dq, dk, dv poisoned (0xff bytes: NaN), so a gradient
// element the backward skips shows.
class BackwardProblem {
 public:
  BackwardProblem(Engine& engine, const BackwardCase& c, unsigned seed);

  // The case's options for a backward in `family` (nullopt: the dispatcher's).
  BackwardOptions options(std::optional<std::string> family = {}) const;
  // Engine::backward on this problem's tensors (no synchronization).
  void backward(const BackwardOptions& options, CUstream_st* stream = nullptr) const;
  void poison();

  struct Gradients {
    HostTensor dq, dk, dv;
  };
  // What the GPU wrote (call after synchronizing), each in its view.
  Gradients gradients() const;
  // The float64 gradients of the same rounded inputs (computed on first use, then kept).
  const ReferenceGradients& reference() const;
  GradientErrors compare(const Gradients& got) const;
  // The sink logits' gradient the last backward wrote (empty without sinks), synchronized.
  std::vector<float> dsink() const;

  const BackwardCase& spec() const { return case_; }
  TensorView q() const { return forward_.q(); }
  TensorView k() const { return forward_.k(); }
  TensorView v() const { return forward_.v(); }
  TensorView out() const { return forward_.out(); }
  TensorView dout() const;
  const float* lse() const { return forward_.lse(); }
  TensorView dq() const { return dq_.out(); }
  TensorView dk() const { return dk_.out(); }
  TensorView dv() const { return dv_.out(); }

 private:
  struct HostInputs {
    HostTensor q, k, v, dout;
  };
  static HostInputs random_inputs(const BackwardCase& c, unsigned seed);
  BackwardProblem(Engine& engine, const BackwardCase& c, HostInputs inputs);

  Engine& engine_;
  BackwardCase case_;
  DeviceProblem forward_;  // q, k, v, out, lse
  HostTensor dout_;
  DeviceBuffer dout_device_;
  PoisonedOutput dq_, dk_, dv_;  // their LSE buffers are empty
  std::optional<DeviceBuffer> alibi_slopes_, sink_logits_, dsink_;  // fp32 [heads_q] each
  mutable std::optional<ReferenceGradients> reference_;
};

struct BackwardCheck : GradientErrors {
  std::string variant;  // the dK/dV variant that ran
  // Sinks: max |dsink - reference| / max(1, max |reference|), and the values.
  double dsink_error = 0;
  std::vector<float> dsink;
};

// Fresh problem (seeded), backward in `family`, compare with the reference.
BackwardCheck run_backward_case(Engine& engine, const BackwardCase& c,
                                std::optional<std::string> family, unsigned seed);

// Every bound of compare_backward.hpp (doctest CHECK), naming the ones that fail.
void check_within_bounds(const GradientErrors& errors, DType dtype);
// The same, and the sink logits' gradient's (where the case has sinks).
void check_within_bounds(const BackwardCheck& check, DType dtype);

}  // namespace flashjit::test

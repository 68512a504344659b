#include "backward_case.hpp"

#include <doctest/doctest.h>
#include <fmt/format.h>

#include <algorithm>
#include <cmath>
#include <random>
#include <vector>

namespace flashjit::test {
namespace {

PoisonedOutput poisoned_like(const Engine& engine, const HostTensor& t) {
  PoisonedOutput out(engine, t.view, t.bits.size(), 0);  // no LSE
  out.poison();
  return out;
}

// One fp32 per query head on the device, from `values` (nullopt for an empty list).
std::optional<DeviceBuffer> per_head(const Engine& engine, const std::vector<double>& values) {
  if (values.empty()) return std::nullopt;
  const std::vector<float> floats(values.begin(), values.end());
  DeviceBuffer buffer(engine, floats.size() * sizeof(float));
  buffer.upload(floats.data(), floats.size() * sizeof(float));
  return buffer;
}

const float* floats(const std::optional<DeviceBuffer>& buffer) {
  return buffer ? static_cast<const float*>(buffer->data()) : nullptr;
}

// The case's score variants into ForwardOptions or BackwardOptions (the same field names).
template <typename Options>
void set_variants(Options& options, const BackwardCase& c, const float* alibi_slopes,
                  const float* sink_logits) {
  options.softmax_scale = c.softmax_scale;
  options.causal = c.causal;
  options.softcap = c.softcap;
  options.window_left = c.window_left;
  options.window_right = c.window_right;
  options.sink_tokens = c.sink_tokens;
  options.alibi_slopes = alibi_slopes;
  options.sink_logits = sink_logits;
  options.user_functions = c.user_functions;
  options.user_args = c.user_args;
}

}  // namespace

std::string BackwardCase::describe() const {
  return fmt::format(
      "b{} hq{} hkv{} sq{} sk{} d{} {} {} {}{}{}{}{}{}{}{}{}", batch, heads_q, heads_kv, seqlen_q,
      seqlen_k, head_dim, causal ? "causal" : "full", to_string(dtype), bhsd ? "bhsd" : "bshd",
      softmax_scale ? fmt::format(" scale {}", *softmax_scale) : "",
      deterministic ? " deterministic" : "",
      tiles ? fmt::format(" tiles m{}n{}s{}", tiles->tile_m, tiles->tile_n, tiles->stages) : "",
      softcap > 0.f ? fmt::format(" softcap {}", softcap) : "",
      window_left >= 0 || window_right >= 0
          ? fmt::format(" window ({}, {}){}", window_left, window_right,
                        sink_tokens > 0 ? fmt::format(" sink tokens {}", sink_tokens) : "")
          : "",
      alibi ? " alibi" : "", sinks ? " sinks" : "",
      user_functions ? " user" + user_functions->hash().substr(0, 8) : "");
}

ScoreMods BackwardCase::mods() const {
  ScoreMods mods;
  mods.softcap = softcap;
  mods.window_left = window_left;
  mods.window_right = window_right;
  mods.sink_tokens = sink_tokens;
  for (int h = 0; h < heads_q; ++h) {
    // Values exact in fp32, so the GPU and the reference use the same numbers.
    if (alibi) mods.alibi_slopes.push_back(std::exp2(-8.0 * (h + 1) / heads_q));
    if (sinks) mods.sink_logits.push_back(0.75 - 0.5 * (h % 4));
  }
  mods.score_mod = score_mod;
  mods.score_mod_grad = score_mod_grad;
  mods.mask_mod = mask_mod;
  return mods;
}

double BackwardCase::scale() const {
  return softmax_scale ? *softmax_scale : 1.0 / std::sqrt(static_cast<double>(head_dim));
}

BackwardProblem::HostInputs BackwardProblem::random_inputs(const BackwardCase& c, unsigned seed) {
  std::mt19937 rng(seed);
  auto random = [&](int seqlen, int heads) {
    HostTensor t = HostTensor::make(c.dtype, c.batch, seqlen, heads, c.head_dim, c.bhsd);
    t.fill_random(rng);
    return t;
  };
  HostInputs in;
  in.q = random(c.seqlen_q, c.heads_q);
  in.k = random(c.seqlen_k, c.heads_kv);
  in.v = random(c.seqlen_k, c.heads_kv);
  in.dout = random(c.seqlen_q, c.heads_q);
  return in;
}

BackwardProblem::BackwardProblem(Engine& engine, const BackwardCase& c, unsigned seed)
    : BackwardProblem(engine, c, random_inputs(c, seed)) {}

BackwardProblem::BackwardProblem(Engine& engine, const BackwardCase& c, HostInputs in)
    : engine_(engine),
      case_(c),
      forward_(engine, std::move(in.q), std::move(in.k), std::move(in.v)),
      dout_(std::move(in.dout)),
      dout_device_(engine, dout_.bytes()),
      dq_(poisoned_like(engine, forward_.host_q())),
      dk_(poisoned_like(engine, forward_.host_k())),
      dv_(poisoned_like(engine, forward_.host_v())) {
  dout_device_.upload(dout_.bits.data(), dout_.bytes());
  const ScoreMods mods = c.mods();
  alibi_slopes_ = per_head(engine, mods.alibi_slopes);
  sink_logits_ = per_head(engine, mods.sink_logits);
  if (c.sinks) {
    dsink_.emplace(engine, static_cast<std::size_t>(c.heads_q) * sizeof(float));
    dsink_->fill_bytes(0xff);  // NaN: a gradient never written shows
  }
  // What training does: the forward saves out and the LSE, the backward reads them.
  ForwardOptions forward;
  set_variants(forward, c, floats(alibi_slopes_), floats(sink_logits_));
  forward.lse = forward_.lse();
  engine.forward(q(), k(), v(), out(), forward);
  synchronize(engine);
}

BackwardOptions BackwardProblem::options(std::optional<std::string> family) const {
  BackwardOptions options;
  set_variants(options, case_, floats(alibi_slopes_), floats(sink_logits_));
  options.deterministic = case_.deterministic;
  options.tiles = case_.tiles;
  options.family = std::move(family);
  options.d_sink_logits = dsink_ ? static_cast<float*>(dsink_->data()) : nullptr;
  return options;
}

std::vector<float> BackwardProblem::dsink() const {
  if (!dsink_) return {};
  synchronize(engine_);
  std::vector<float> values(static_cast<std::size_t>(case_.heads_q));
  dsink_->download(values.data(), values.size() * sizeof(float));
  return values;
}

void BackwardProblem::backward(const BackwardOptions& options, CUstream_st* stream) const {
  engine_.backward(q(), k(), v(), out(), dout(), lse(), dq(), dk(), dv(), options, stream);
}

void BackwardProblem::poison() {
  dq_.poison();
  dk_.poison();
  dv_.poison();
}

TensorView BackwardProblem::dout() const {
  TensorView view = dout_.view;
  view.data = dout_device_.data();
  return view;
}

BackwardProblem::Gradients BackwardProblem::gradients() const {
  return {dq_.output(), dk_.output(), dv_.output()};
}

const ReferenceGradients& BackwardProblem::reference() const {
  if (!reference_)
    reference_ = reference_attention_backward(forward_.host_q(), forward_.host_k(),
                                              forward_.host_v(), dout_, case_.scale(),
                                              case_.causal, case_.mods());
  return *reference_;
}

GradientErrors BackwardProblem::compare(const Gradients& got) const {
  return compare_backward(got.dq, got.dk, got.dv, reference());
}

BackwardCheck run_backward_case(Engine& engine, const BackwardCase& c,
                                std::optional<std::string> family, unsigned seed) {
  const BackwardProblem problem(engine, c, seed);
  const BackwardOptions options = problem.options(std::move(family));
  BackwardCheck check;
  check.variant =
      engine.select_backward_variant(problem.q(), problem.k(), problem.v(), options).name();
  problem.backward(options);
  synchronize(engine);
  static_cast<GradientErrors&>(check) = problem.compare(problem.gradients());
  check.dsink = problem.dsink();
  const std::vector<double>& want = problem.reference().dsink;
  REQUIRE(check.dsink.size() == want.size());
  double scale = 1;
  for (double x : want) scale = std::max(scale, std::abs(x));
  for (std::size_t h = 0; h < want.size(); ++h) {
    const double error = std::abs(check.dsink[h] - want[h]) / scale;
    check.dsink_error = std::isfinite(error) ? std::max(check.dsink_error, error) : INFINITY;
  }
  return check;
}

void check_within_bounds(const GradientErrors& errors, DType dtype) {
  const std::string failures = describe_failures(errors, dtype);
  CHECK_MESSAGE(failures.empty(), failures);
}

void check_within_bounds(const BackwardCheck& check, DType dtype) {
  check_within_bounds(static_cast<const GradientErrors&>(check), dtype);
  // dsink sums exp(sink - lse) · delta over every row: delta from the 16-bit O and dO.
  CHECK_MESSAGE(check.dsink_error <= gradient_tolerance(dtype),
                fmt::format("dsink: error {:.3g} > {:.3g} ({} heads)", check.dsink_error,
                            gradient_tolerance(dtype), check.dsink.size()));
}

}  // namespace flashjit::test

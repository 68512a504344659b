#include "backward_case.hpp"

#include <doctest/doctest.h>
#include <fmt/format.h>

#include <cmath>
#include <random>

namespace flashjit::test {
namespace {

PoisonedOutput poisoned_like(const Engine& engine, const HostTensor& t) {
  PoisonedOutput out(engine, t.view, t.bits.size(), 0);  // no LSE
  out.poison();
  return out;
}

}  // namespace

std::string BackwardCase::describe() const {
  return fmt::format(
      "b{} hq{} hkv{} sq{} sk{} d{} {} {} {}{}{}{}", batch, heads_q, heads_kv, seqlen_q, seqlen_k,
      head_dim, causal ? "causal" : "full", to_string(dtype), bhsd ? "bhsd" : "bshd",
      softmax_scale ? fmt::format(" scale {}", *softmax_scale) : "",
      deterministic ? " deterministic" : "",
      tiles ? fmt::format(" tiles m{}n{}s{}", tiles->tile_m, tiles->tile_n, tiles->stages) : "");
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
  // What training does: the forward saves out and the LSE, the backward reads them.
  ForwardOptions forward;
  forward.softmax_scale = c.softmax_scale;
  forward.causal = c.causal;
  forward.lse = forward_.lse();
  engine.forward(q(), k(), v(), out(), forward);
  synchronize(engine);
}

BackwardOptions BackwardProblem::options(std::optional<std::string> family) const {
  BackwardOptions options;
  options.softmax_scale = case_.softmax_scale;
  options.causal = case_.causal;
  options.deterministic = case_.deterministic;
  options.tiles = case_.tiles;
  options.family = std::move(family);
  return options;
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
    reference_ =
        reference_attention_backward(forward_.host_q(), forward_.host_k(), forward_.host_v(), dout_,
                                     case_.scale(), case_.causal);
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
  return check;
}

void check_within_bounds(const GradientErrors& errors, DType dtype) {
  const std::string failures = describe_failures(errors, dtype);
  CHECK_MESSAGE(failures.empty(), failures);
}

}  // namespace flashjit::test

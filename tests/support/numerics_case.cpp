#include "numerics_case.hpp"

#include "device_problem.hpp"

#include <algorithm>
#include <cmath>
#include <limits>
#include <random>
#include <vector>

#include "flashjit/device_memory.hpp"

namespace flashjit::test {
namespace {

// A BSHD tensor whose strides carry the case's padding; the gaps are part of `bits`.
HostTensor padded_tensor(DType dtype, std::int64_t b, std::int64_t s, std::int64_t h,
                         std::int64_t d, const std::array<std::int64_t, 3>& pad) {
  HostTensor t;
  const std::int64_t head = d + pad[0], row = h * head + pad[1], batch = s * row + pad[2];
  t.view = TensorView{nullptr, dtype, {b, s, h, d}, {batch, row, head, 1}};
  t.bits.resize(static_cast<size_t>(std::max<std::int64_t>(b * batch, 1)));
  return t;
}

// Whether flat element `i` of `t` belongs to the tensor (rather than to a gap between rows).
std::vector<bool> element_mask(const HostTensor& t) {
  std::vector<bool> inside(t.bits.size(), false);
  const auto& shape = t.view.shape;
  for (std::int64_t b = 0; b < shape[0]; ++b)
    for (std::int64_t s = 0; s < shape[1]; ++s)
      for (std::int64_t h = 0; h < shape[2]; ++h)
        for (std::int64_t d = 0; d < shape[3]; ++d)
          inside[static_cast<size_t>(t.offset(b, s, h, d))] = true;
  return inside;
}

double max_abs_logit(const HostTensor& q, const HostTensor& k, double scale, bool causal) {
  const auto B = q.view.shape[0], SQ = q.view.shape[1], HQ = q.view.shape[2], D = q.view.shape[3];
  const auto SK = k.view.shape[1], HKV = k.view.shape[2];
  double largest = 0;
  for (std::int64_t b = 0; b < B; ++b)
    for (std::int64_t h = 0; h < HQ; ++h)
      for (std::int64_t i = 0; i < SQ; ++i) {
        const std::int64_t visible = causal ? std::min(SK, i + 1 + SK - SQ) : SK;
        for (std::int64_t j = 0; j < visible; ++j) {
          double dot = 0;
          for (std::int64_t d = 0; d < D; ++d)
            dot += q.at(b, i, h, d) * k.at(b, j, h / (HQ / HKV), d);
          largest = std::max(largest, std::abs(dot * scale));
        }
      }
  return largest;
}

}  // namespace

bool row_is_zero(const HostTensor& out, std::int64_t b, std::int64_t s, std::int64_t h) {
  for (std::int64_t d = 0; d < out.view.shape[3]; ++d)
    if ((out.bits[static_cast<size_t>(out.offset(b, s, h, d))] & 0x7fff) != 0) return false;
  return true;
}

NumericsResult run_numerics_case(Engine& engine, const NumericsCase& c,
                                 std::optional<std::string> family, unsigned seed) {
  const ForwardCase& s = c.shape;
  std::mt19937 rng(seed);
  auto q = padded_tensor(s.dtype, s.batch, s.seqlen_q, s.heads_q, s.head_dim, c.padding);
  auto k = padded_tensor(s.dtype, s.batch, s.seqlen_k, s.heads_kv, s.head_dim, c.padding);
  auto v = padded_tensor(s.dtype, s.batch, s.seqlen_k, s.heads_kv, s.head_dim, c.padding);
  q.fill_random(rng, c.q_scale);
  k.fill_random(rng, c.k_scale);
  v.fill_random(rng, c.v_scale);

  const DeviceProblem problem(engine, std::move(q), std::move(k), std::move(v), c.poison);
  ForwardOptions options;
  options.causal = s.causal;
  options.family = family;
  options.softmax_scale = c.softmax_scale;
  options.lse = problem.lse();
  NumericsResult result;
  result.check.variant =
      engine.select_variant(problem.q(), problem.k(), problem.v(), problem.out(), options).name();
  engine.forward(problem.q(), problem.k(), problem.v(), problem.out(), options);
  synchronize(engine);

  result.out = problem.output();
  const std::vector<float> lse = problem.lse_values();

  const std::uint16_t poison_bits = static_cast<std::uint16_t>(c.poison * 0x0101u);
  const std::vector<bool> inside = element_mask(result.out);
  for (size_t i = 0; i < inside.size(); ++i)
    if (!inside[i] && result.out.bits[i] != poison_bits) result.gaps_untouched = false;

  const double scale = c.softmax_scale.value_or(1.0 / std::sqrt(static_cast<double>(s.head_dim)));
  result.max_abs_logit = max_abs_logit(problem.host_q(), problem.host_k(), scale, s.causal);
  const Reference ref = reference_attention(problem.host_q(), problem.host_k(), problem.host_v(),
                                            scale, s.causal);
  static_cast<ForwardErrors&>(result.check) = compare_forward(result.out, &lse, ref);
  return result;
}

}  // namespace flashjit::test

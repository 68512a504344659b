#include "reference_backward.hpp"

#include <algorithm>
#include <cmath>
#include <limits>

namespace flashjit::test {
namespace {

// The tensor's values as doubles, contiguous [b, s, h, d] whatever its strides: the inner loops
// then walk unit-stride rows instead of decoding 16-bit values at every use.
std::vector<double> values(const HostTensor& t) {
  const auto& shape = t.view.shape;
  std::vector<double> out;
  out.reserve(static_cast<std::size_t>(shape[0] * shape[1] * shape[2] * shape[3]));
  for (std::int64_t b = 0; b < shape[0]; ++b)
    for (std::int64_t s = 0; s < shape[1]; ++s)
      for (std::int64_t h = 0; h < shape[2]; ++h)
        for (std::int64_t d = 0; d < shape[3]; ++d) out.push_back(t.at(b, s, h, d));
  return out;
}

double dot(const double* a, const double* b, std::int64_t n) {
  double sum = 0;
  for (std::int64_t i = 0; i < n; ++i) sum += a[i] * b[i];
  return sum;
}

void add_scaled(double* into, double scale, const double* x, std::int64_t n) {
  for (std::int64_t i = 0; i < n; ++i) into[i] += scale * x[i];
}

}  // namespace

ReferenceGradients reference_attention_backward(const HostTensor& q, const HostTensor& k,
                                                const HostTensor& v, const HostTensor& dout,
                                                double softmax_scale, bool causal,
                                                const ScoreMods& mods) {
  const auto B = q.view.shape[0], SQ = q.view.shape[1], HQ = q.view.shape[2], D = q.view.shape[3];
  const auto SK = k.view.shape[1], HKV = k.view.shape[2];
  const std::vector<double> Q = values(q), K = values(k), V = values(v), dO = values(dout);
  // Row (b, s, h) of a contiguous [b, s, h, d] tensor with `heads` heads.
  auto row = [D](std::int64_t b, std::int64_t s, std::int64_t h, std::int64_t seqlen,
                 std::int64_t heads) { return ((b * seqlen + s) * heads + h) * D; };

  ReferenceGradients grads;
  grads.dq.assign(Q.size(), 0.0);
  grads.dk.assign(K.size(), 0.0);
  grads.dv.assign(V.size(), 0.0);
  grads.query_sees_nothing.assign(static_cast<std::size_t>(SQ), false);
  grads.key_seen_by_none.assign(static_cast<std::size_t>(SK), true);
  if (!mods.sink_logits.empty()) grads.dsink.assign(static_cast<std::size_t>(HQ), 0.0);
  // Bottom-right alignment: query i sits at key position i + SK - SQ.
  auto seen = [&](std::int64_t i, std::int64_t j) {
    return visible_by_masks(mods, causal, i + SK - SQ, j);
  };
  for (std::int64_t i = 0; i < SQ; ++i) {
    grads.query_sees_nothing[i] = true;
    for (std::int64_t j = 0; j < SK; ++j)
      if (seen(i, j)) grads.query_sees_nothing[i] = grads.key_seen_by_none[j] = false;
  }

  constexpr double kNegInf = -std::numeric_limits<double>::infinity();
  // Per key: P, dP, and d score / d(q·k) (softmax_scale, times 1 - tanh² under a cap).
  std::vector<double> p(static_cast<std::size_t>(SK)), dp(static_cast<std::size_t>(SK)),
      dscore(static_cast<std::size_t>(SK));
  for (std::int64_t b = 0; b < B; ++b)
    for (std::int64_t h = 0; h < HQ; ++h) {
      const std::int64_t hk = h / (HQ / HKV);
      const double sink = mods.sink_logits.empty() ? kNegInf : mods.sink_logits[h];
      const double slope = mods.alibi_slopes.empty() ? 0.0 : mods.alibi_slopes[h];
      for (std::int64_t i = 0; i < SQ; ++i) {
        if (grads.query_sees_nothing[i]) continue;  // zero dq, nothing to dk, dv (and the sink)
        const double* q_i = &Q[row(b, i, h, SQ, HQ)];
        const double* do_i = &dO[row(b, i, h, SQ, HQ)];
        double max_score = sink;
        for (std::int64_t j = 0; j < SK; ++j) {
          if (!seen(i, j)) {
            p[j] = kNegInf;
            continue;
          }
          double s = softmax_scale * dot(q_i, &K[row(b, j, hk, SK, HKV)], D);
          dscore[j] = softmax_scale;
          if (mods.softcap > 0) {
            const double t = std::tanh(s / mods.softcap);
            s = mods.softcap * t;
            dscore[j] *= 1 - t * t;
          }
          p[j] = s - slope * static_cast<double>(std::abs(i + SK - SQ - j));
          max_score = std::max(max_score, p[j]);
        }
        double sum = sink == kNegInf ? 0.0 : std::exp(sink - max_score);
        for (std::int64_t j = 0; j < SK; ++j)
          if (p[j] != kNegInf) sum += (p[j] = std::exp(p[j] - max_score));
        // D_i = Σ_j P_ij dP_ij: the softmax's Jacobian applied to dP (= rowsum(dO∘O)).
        double row_sum = 0;
        for (std::int64_t j = 0; j < SK; ++j) {
          if (p[j] == kNegInf) continue;
          p[j] /= sum;
          dp[j] = dot(do_i, &V[row(b, j, hk, SK, HKV)], D);
          row_sum += p[j] * dp[j];
        }
        if (sink != kNegInf) grads.dsink[h] -= std::exp(sink - max_score) / sum * row_sum;
        double* dq_i = &grads.dq[row(b, i, h, SQ, HQ)];
        for (std::int64_t j = 0; j < SK; ++j) {
          if (p[j] == kNegInf) continue;
          const std::int64_t kv = row(b, j, hk, SK, HKV);
          const double ds = p[j] * (dp[j] - row_sum) * dscore[j];
          add_scaled(&grads.dv[kv], p[j], do_i, D);
          add_scaled(dq_i, ds, &K[kv], D);
          add_scaled(&grads.dk[kv], ds, q_i, D);
        }
      }
    }
  return grads;
}

}  // namespace flashjit::test

#include "reference_backward.hpp"

#include <algorithm>
#include <cmath>
#include <limits>
#include <stdexcept>

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
  if (mods.score_mod && !mods.score_mod_grad)
    throw std::invalid_argument("reference_attention_backward: a score_mod needs score_mod_grad");
  // Bottom-right alignment: query i sits at key position i + SK - SQ; mask_mod sees the rows of
  // the tensors and the batch the user functions see.
  auto seen = [&](std::int64_t b, std::int64_t h, std::int64_t i, std::int64_t j) {
    return visible_by_masks(mods, causal, i + SK - SQ, j) &&
           (!mods.mask_mod || mods.mask_mod(mods.first_batch + static_cast<int>(b),
                                            static_cast<int>(h), static_cast<int>(i),
                                            static_cast<int>(j)));
  };
  // Zero by the masks in every batch and head.
  grads.query_sees_nothing.assign(static_cast<std::size_t>(SQ), true);
  for (std::int64_t b = 0; b < (mods.mask_mod ? B : std::min<std::int64_t>(B, 1)); ++b)
    for (std::int64_t h = 0; h < (mods.mask_mod ? HQ : std::min<std::int64_t>(HQ, 1)); ++h)
      for (std::int64_t i = 0; i < SQ; ++i)
        for (std::int64_t j = 0; j < SK; ++j)
          if (seen(b, h, i, j)) grads.query_sees_nothing[i] = grads.key_seen_by_none[j] = false;

  constexpr double kNegInf = -std::numeric_limits<double>::infinity();
  // Per key: P, dP, and d score / d(q·k) (softmax_scale, times 1 - tanh² under a cap).
  std::vector<double> p(static_cast<std::size_t>(SK)), dp(static_cast<std::size_t>(SK)),
      dscore(static_cast<std::size_t>(SK));
  for (std::int64_t b = 0; b < B; ++b)
    for (std::int64_t h = 0; h < HQ; ++h) {
      const std::int64_t hk = h / (HQ / HKV);
      const double sink = mods.sink_logits.empty() ? kNegInf : mods.sink_logits[h];
      const double slope = mods.alibi_slopes.empty() ? 0.0 : mods.alibi_slopes[h];
      const int batch = mods.first_batch + static_cast<int>(b), head = static_cast<int>(h);
      for (std::int64_t i = 0; i < SQ; ++i) {
        const double* q_i = &Q[row(b, i, h, SQ, HQ)];
        const double* do_i = &dO[row(b, i, h, SQ, HQ)];
        double max_score = sink;
        bool sees_some = false;
        for (std::int64_t j = 0; j < SK; ++j) {
          if (!seen(b, h, i, j)) {
            p[j] = kNegInf;
            continue;
          }
          sees_some = true;
          double s = softmax_scale * dot(q_i, &K[row(b, j, hk, SK, HKV)], D);
          dscore[j] = softmax_scale;
          if (mods.softcap > 0) {
            const double t = std::tanh(s / mods.softcap);
            s = mods.softcap * t;
            dscore[j] *= 1 - t * t;
          }
          s -= slope * static_cast<double>(std::abs(i + SK - SQ - j));
          if (mods.score_mod) {
            const int q_idx = static_cast<int>(i), kv_idx = static_cast<int>(j);
            dscore[j] *= mods.score_mod_grad(s, batch, head, q_idx, kv_idx);
            s = mods.score_mod(s, batch, head, q_idx, kv_idx);
          }
          p[j] = s;
          max_score = std::max(max_score, p[j]);
        }
        if (!sees_some) continue;  // zero dq, nothing to dk, dv (and the sink)
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

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
                                                double softmax_scale, bool causal) {
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
  // Bottom-right alignment: query i sits at key position i + SK - SQ and sees keys up to it.
  auto last_key = [&](std::int64_t i) { return causal ? std::min(SK - 1, i + SK - SQ) : SK - 1; };
  for (std::int64_t i = 0; i < SQ; ++i) {
    grads.query_sees_nothing[i] = last_key(i) < 0;
    for (std::int64_t j = 0; j <= last_key(i); ++j) grads.key_seen_by_none[j] = false;
  }

  std::vector<double> p(static_cast<std::size_t>(SK)), dp(static_cast<std::size_t>(SK));
  for (std::int64_t b = 0; b < B; ++b)
    for (std::int64_t h = 0; h < HQ; ++h) {
      const std::int64_t hk = h / (HQ / HKV);
      for (std::int64_t i = 0; i < SQ; ++i) {
        const std::int64_t keys = last_key(i) + 1;  // keys 0 .. keys-1 are visible
        if (keys <= 0) continue;                    // zero dq, nothing to dk and dv
        const double* q_i = &Q[row(b, i, h, SQ, HQ)];
        const double* do_i = &dO[row(b, i, h, SQ, HQ)];
        double max_score = -std::numeric_limits<double>::infinity();
        for (std::int64_t j = 0; j < keys; ++j) {
          p[j] = softmax_scale * dot(q_i, &K[row(b, j, hk, SK, HKV)], D);
          max_score = std::max(max_score, p[j]);
        }
        double sum = 0;
        for (std::int64_t j = 0; j < keys; ++j) sum += (p[j] = std::exp(p[j] - max_score));
        // D_i = Σ_j P_ij dP_ij: the softmax's Jacobian applied to dP.
        double row_sum = 0;
        for (std::int64_t j = 0; j < keys; ++j) {
          p[j] /= sum;
          dp[j] = dot(do_i, &V[row(b, j, hk, SK, HKV)], D);
          row_sum += p[j] * dp[j];
        }
        double* dq_i = &grads.dq[row(b, i, h, SQ, HQ)];
        for (std::int64_t j = 0; j < keys; ++j) {
          const std::int64_t kv = row(b, j, hk, SK, HKV);
          const double ds = p[j] * (dp[j] - row_sum);
          add_scaled(&grads.dv[kv], p[j], do_i, D);
          add_scaled(dq_i, softmax_scale * ds, &K[kv], D);
          add_scaled(&grads.dk[kv], softmax_scale * ds, q_i, D);
        }
      }
    }
  return grads;
}

}  // namespace flashjit::test

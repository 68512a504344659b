#include "reference.hpp"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <limits>

namespace flashjit::test {

float to_float(DType dtype, std::uint16_t bits) {
  if (dtype == DType::bf16) {
    std::uint32_t word = static_cast<std::uint32_t>(bits) << 16;
    float f;
    std::memcpy(&f, &word, 4);
    return f;
  }
  return static_cast<float>(static_cast<_Float16>(std::bit_cast<_Float16>(bits)));
}

std::uint16_t from_float(DType dtype, float value) {
  if (dtype == DType::bf16) {
    std::uint32_t word;
    std::memcpy(&word, &value, 4);
    word += 0x7fffu + ((word >> 16) & 1u);  // round to nearest even
    return static_cast<std::uint16_t>(word >> 16);
  }
  return std::bit_cast<std::uint16_t>(static_cast<_Float16>(value));
}

HostTensor HostTensor::make(DType dtype, std::int64_t b, std::int64_t s, std::int64_t h,
                            std::int64_t d, bool bhsd) {
  HostTensor t;
  t.view = bhsd ? TensorView::bhsd(nullptr, dtype, b, s, h, d)
                : TensorView::bshd(nullptr, dtype, b, s, h, d);
  t.bits.resize(static_cast<size_t>(b * s * h * d));
  return t;
}

std::int64_t HostTensor::offset(std::int64_t b, std::int64_t s, std::int64_t h,
                                std::int64_t d) const {
  return b * view.stride[0] + s * view.stride[1] + h * view.stride[2] + d * view.stride[3];
}

double HostTensor::at(std::int64_t b, std::int64_t s, std::int64_t h, std::int64_t d) const {
  return to_float(view.dtype, bits[static_cast<size_t>(offset(b, s, h, d))]);
}

void HostTensor::fill_random(std::mt19937& rng, double scale) {
  std::normal_distribution<float> normal(0.f, static_cast<float>(scale));
  for (auto& x : bits) x = from_float(view.dtype, normal(rng));
}

void HostTensor::fill(std::uint16_t pattern) { std::fill(bits.begin(), bits.end(), pattern); }

bool visible_by_masks(const ScoreMods& mods, bool causal, std::int64_t at, std::int64_t j) {
  const std::int64_t right = causal ? 0 : mods.window_right;  // causal: no key past the query
  if (right >= 0 && j > at + right) return false;
  if (j < mods.sink_tokens) return true;
  return mods.window_left < 0 || j >= at - mods.window_left;
}

Reference reference_attention(const HostTensor& q, const HostTensor& k, const HostTensor& v,
                              double softmax_scale, bool causal, const ScoreMods& mods) {
  const auto B = q.view.shape[0], SQ = q.view.shape[1], HQ = q.view.shape[2], D = q.view.shape[3];
  const auto SK = k.view.shape[1], HKV = k.view.shape[2];
  constexpr double kNegInf = -std::numeric_limits<double>::infinity();
  Reference ref;
  ref.out.assign(static_cast<size_t>(B * SQ * HQ * D), 0.0);
  ref.lse.assign(static_cast<size_t>(B * HQ * SQ), kNegInf);
  std::vector<double> scores(static_cast<size_t>(SK));
  for (std::int64_t b = 0; b < B; ++b)
    for (std::int64_t h = 0; h < HQ; ++h) {
      const std::int64_t hk = h / (HQ / HKV);
      const double sink = mods.sink_logits.empty() ? kNegInf : mods.sink_logits[h];
      const double slope = mods.alibi_slopes.empty() ? 0.0 : mods.alibi_slopes[h];
      for (std::int64_t i = 0; i < SQ; ++i) {
        const std::int64_t at = i + SK - SQ;
        double max_score = sink;
        const int batch = mods.first_batch + static_cast<int>(b);
        const int head = static_cast<int>(h), q_idx = static_cast<int>(i);
        for (std::int64_t j = 0; j < SK; ++j) {
          const int kv_idx = static_cast<int>(j);
          // The masks come after score_mod but do not depend on the score: a masked key's score
          // is not computed.
          if (!visible_by_masks(mods, causal, at, j) ||
              (mods.mask_mod && !mods.mask_mod(batch, head, q_idx, kv_idx))) {
            scores[j] = kNegInf;
            continue;
          }
          double dot = 0;
          for (std::int64_t d = 0; d < D; ++d) dot += q.at(b, i, h, d) * k.at(b, j, hk, d);
          double s = dot * softmax_scale;
          if (mods.softcap > 0) s = mods.softcap * std::tanh(s / mods.softcap);
          s -= slope * static_cast<double>(std::abs(at - j));
          if (mods.score_mod) s = mods.score_mod(s, batch, head, q_idx, kv_idx);
          scores[j] = s;
          max_score = std::max(max_score, s);
        }
        if (max_score == kNegInf) continue;  // no visible key and no sink: 0, LSE -inf
        double sum = sink == kNegInf ? 0.0 : std::exp(sink - max_score);
        for (std::int64_t j = 0; j < SK; ++j)
          if (scores[j] != kNegInf) sum += (scores[j] = std::exp(scores[j] - max_score));
        double* out = &ref.out[static_cast<size_t>(((b * SQ + i) * HQ + h) * D)];
        for (std::int64_t j = 0; j < SK; ++j) {
          if (scores[j] == kNegInf) continue;
          for (std::int64_t d = 0; d < D; ++d) out[d] += scores[j] / sum * v.at(b, j, hk, d);
        }
        ref.lse[static_cast<size_t>((b * HQ + h) * SQ + i)] = max_score + std::log(sum);
      }
    }
  return ref;
}

}  // namespace flashjit::test

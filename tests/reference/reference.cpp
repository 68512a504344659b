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

Reference reference_attention(const HostTensor& q, const HostTensor& k, const HostTensor& v,
                              double softmax_scale, bool causal) {
  const auto B = q.view.shape[0], SQ = q.view.shape[1], HQ = q.view.shape[2], D = q.view.shape[3];
  const auto SK = k.view.shape[1], HKV = k.view.shape[2];
  Reference ref;
  ref.out.assign(static_cast<size_t>(B * SQ * HQ * D), 0.0);
  ref.lse.assign(static_cast<size_t>(B * HQ * SQ), -std::numeric_limits<double>::infinity());
  std::vector<double> scores(static_cast<size_t>(SK));
  for (std::int64_t b = 0; b < B; ++b)
    for (std::int64_t h = 0; h < HQ; ++h) {
      const std::int64_t hk = h / (HQ / HKV);
      for (std::int64_t i = 0; i < SQ; ++i) {
        // Bottom-right aligned causal mask, as FlashAttention.
        const std::int64_t visible = causal ? std::min(SK, i + 1 + SK - SQ) : SK;
        if (visible <= 0) continue;  // output stays 0, LSE -inf
        double max_score = -std::numeric_limits<double>::infinity();
        for (std::int64_t j = 0; j < visible; ++j) {
          double dot = 0;
          for (std::int64_t d = 0; d < D; ++d) dot += q.at(b, i, h, d) * k.at(b, j, hk, d);
          scores[j] = dot * softmax_scale;
          max_score = std::max(max_score, scores[j]);
        }
        double sum = 0;
        for (std::int64_t j = 0; j < visible; ++j)
          sum += (scores[j] = std::exp(scores[j] - max_score));
        double* out = &ref.out[static_cast<size_t>(((b * SQ + i) * HQ + h) * D)];
        for (std::int64_t j = 0; j < visible; ++j)
          for (std::int64_t d = 0; d < D; ++d) out[d] += scores[j] / sum * v.at(b, j, hk, d);
        ref.lse[static_cast<size_t>((b * HQ + h) * SQ + i)] = max_score + std::log(sum);
      }
    }
  return ref;
}

}  // namespace flashjit::test

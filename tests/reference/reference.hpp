// Host-side attention in float64: the ground truth for GPU tests. Inputs are bf16/fp16 bit
// patterns in strided [b, s, h, d] layouts, the same views the engine takes.
#pragma once

#include <cstddef>
#include <cstdint>
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
  std::vector<double> lse;  // [b, hq, sq]; -inf for rows with no visible key
};
Reference reference_attention(const HostTensor& q, const HostTensor& k, const HostTensor& v,
                              double softmax_scale, bool causal);

}  // namespace flashjit::test

// One forward problem with chosen input magnitudes, softmax scale, padded strides and output
// poison, run on the GPU and compared to the float64 reference. For the numerics tests: large
// logits, fully masked rows, seqlen 1, odd strides, bitwise determinism.
#pragma once

#include <array>
#include <cstdint>
#include <optional>

#include "compare.hpp"
#include "flashjit/flashjit.hpp"
#include "forward_case.hpp"
#include "reference.hpp"

namespace flashjit::test {

struct NumericsCase {
  ForwardCase shape;  // sizes, causal, dtype (layout: BSHD, padded as below)
  // Standard deviations of the normal inputs. Powers of two scale bf16/fp16 values exactly.
  double q_scale = 1, k_scale = 1, v_scale = 1;
  std::optional<float> softmax_scale;  // default 1/sqrt(head_dim)
  // Elements added to the head, seqlen and batch strides of every tensor (multiples of 8):
  // stride[2] = d + pad[0], stride[1] = heads * stride[2] + pad[1], stride[0] = s * stride[1] +
  // pad[2].
  std::array<std::int64_t, 3> padding{0, 0, 0};
  unsigned char poison = 0xff;  // what the output buffer holds before the launch (0xff: NaN)
};

struct NumericsResult {
  ForwardCheck check;          // errors against the float64 reference
  double max_abs_logit = 0;    // max |softmax_scale * q.k| over the pairs the mask lets through
  HostTensor out;              // the output as the GPU wrote it, strides included
  bool gaps_untouched = true;  // the padding between rows still holds the poison
};

// Throws what Engine::forward throws (Error(unsupported) when `family` cannot run the case).
NumericsResult run_numerics_case(Engine& engine, const NumericsCase& c,
                                 std::optional<std::string> family, unsigned seed);

// Whether out[b, s, h, :] is all (positive or negative) zeros.
bool row_is_zero(const HostTensor& out, std::int64_t b, std::int64_t s, std::int64_t h);

}  // namespace flashjit::test

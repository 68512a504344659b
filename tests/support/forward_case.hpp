// One forward problem run on the GPU and checked against the float64 reference.
#pragma once

#include <string>

#include "flashjit/flashjit.hpp"

namespace flashjit::test {

struct ForwardCase {
  int batch = 1, heads_q = 1, heads_kv = 1, seqlen_q = 1, seqlen_k = 1, head_dim = 64;
  bool causal = false;
  DType dtype = DType::bf16;
  bool bhsd = false;
  bool with_lse = true;
  std::string describe() const;
};

struct ForwardCheck {
  double max_abs_error = 0;
  double relative_l2_error = 0;
  double max_lse_error = 0;
  bool all_written = true;  // no poison (NaN) left in the output
  std::string variant;
};

// Fresh random inputs (seeded by `seed`), poisoned output, forward, compare.
ForwardCheck run_forward_case(Engine& engine, const ForwardCase& c, std::optional<Family> family,
                              unsigned seed);

// Bounds: bf16 output rounding dominates (2^-8 relative), fp16 is 8x finer.
double max_abs_tolerance(DType dtype);
double relative_tolerance(DType dtype);

}  // namespace flashjit::test

// Forward correctness on the GPU, for every kernel family that runs on it, against float64.
#include <doctest/doctest.h>
#include <fmt/format.h>

#include <vector>

#include "forward_case.hpp"
#include "gpu.hpp"

using namespace flashjit;
using namespace flashjit::test;

namespace {

Engine& engine() { return shared_engine(); }

std::vector<ForwardCase> correctness_cases() {
  std::vector<ForwardCase> cases;
  for (int d : supported_head_dims())
    for (bool causal : {false, true}) cases.push_back({2, 4, 2, 200, 200, d, causal});
  // seqlen_q != seqlen_k both ways (bottom-right causal; the second has fully masked rows).
  for (bool causal : {false, true}) {
    cases.push_back({1, 2, 2, 77, 300, 128, causal});
    cases.push_back({1, 2, 1, 300, 77, 64, causal});
    cases.push_back({1, 2, 2, 1, 513, 128, causal});
    cases.push_back({2, 2, 2, 1, 1, 256, causal});
    cases.push_back({1, 1, 1, 640, 640, 128, causal});  // several tiles, tile multiples
  }
  cases.push_back({1, 8, 1, 129, 257, 64, true});    // MQA
  cases.push_back({2, 8, 2, 150, 150, 128, false});  // GQA 4:1
  ForwardCase bhsd{2, 4, 2, 190, 211, 128, true};
  bhsd.bhsd = true;
  cases.push_back(bhsd);
  ForwardCase fp16{2, 4, 4, 170, 170, 128, true, DType::fp16};
  cases.push_back(fp16);
  ForwardCase fp16_bhsd{1, 4, 2, 100, 333, 256, false, DType::fp16, true};
  cases.push_back(fp16_bhsd);
  ForwardCase fp16_d64{1, 2, 2, 333, 100, 64, true, DType::fp16};
  cases.push_back(fp16_d64);
  return cases;
}

}  // namespace

TEST_CASE("forward matches the float64 reference for every family on this GPU") {
  unsigned seed = 1234;
  for (const std::string& family : family_names()) {
    for (const ForwardCase& c : correctness_cases()) {
      const std::optional<ForwardCheck> ran = run_if_supported(engine(), c, family, seed++);
      if (!ran) continue;
      const ForwardCheck& check = *ran;
      CAPTURE(check.variant);
      CAPTURE(c.describe());
      check_within_bounds(check, c.dtype);
      MESSAGE(fmt::format("{:<45} {:<40} max_abs {:.2e} rel {:.2e} lse {:.2e}", check.variant,
                          c.describe(), check.max_abs_error, check.relative_l2_error,
                          check.max_lse_error));
    }
  }
}

// Sliding windows (ForwardOptions::window_left / window_right) in every family on this GPU that
// builds them, against the float64 reference: both sides, one side, with causal, seqlen_q !=
// seqlen_k (bottom-right alignment), windows narrower than a tile and wider than the sequence,
// rows that the window leaves empty (output 0, LSE -inf), and GQA.
#include <doctest/doctest.h>

#include <optional>
#include <vector>

#include "forward_case.hpp"
#include "gpu.hpp"

using namespace flashjit;
using namespace flashjit::test;

namespace {

std::vector<ForwardCase> window_cases() {
  std::vector<ForwardCase> cases;
  for (int d : {64, 128, 256}) {
    ForwardCase both{2, 4, 2, 300, 300, d, false};
    both.window_left = 100, both.window_right = 20;
    cases.push_back(both);
    ForwardCase local{1, 4, 4, 500, 500, d, true};  // Mistral-style: causal, 128 keys back
    local.window_left = 128;
    cases.push_back(local);
  }
  ForwardCase narrow{1, 2, 2, 257, 257, 128, false};  // narrower than a key tile
  narrow.window_left = 3, narrow.window_right = 5;
  cases.push_back(narrow);
  ForwardCase right_only{1, 2, 2, 200, 333, 128, false};  // seqlen_q < seqlen_k: bottom-right
  right_only.window_right = 10;
  cases.push_back(right_only);
  ForwardCase wide{2, 8, 2, 150, 150, 64, true};  // wider than the sequence: plain causal
  wide.window_left = 1000;
  cases.push_back(wide);
  // seqlen_q > seqlen_k: the first rows' windows end before key 0, so they see nothing.
  ForwardCase empty_rows{1, 2, 2, 300, 100, 128, false};
  empty_rows.window_left = 10, empty_rows.window_right = 0;
  cases.push_back(empty_rows);
  return cases;
}

}  // namespace

TEST_CASE("a sliding window matches the float64 reference for every family that builds it") {
  unsigned seed = 4242;
  int ran_somewhere = 0;
  for (const std::string& family : family_names()) {
    for (const ForwardCase& c : window_cases()) {
      // The same shape without the window first: its launch plan is cached, and must not serve
      // the windowed call.
      ForwardCase plain = c;
      plain.window_left = plain.window_right = -1;
      const std::optional<ForwardCheck> full = run_if_supported(shared_engine(), plain, family, seed);
      if (!full) continue;
      CHECK_FALSE(full->variant.ends_with(".window"));
      const std::optional<ForwardCheck> ran = run_if_supported(shared_engine(), c, family, seed++);
      if (!ran) continue;
      ++ran_somewhere;
      const ForwardCheck& check = *ran;
      CAPTURE(check.variant);
      CAPTURE(c.describe());
      CHECK(check.variant.ends_with(".window"));
      check_within_bounds(check, c.dtype);
    }
  }
  CHECK(ran_somewhere > 0);  // some family on this GPU builds window kernels
}

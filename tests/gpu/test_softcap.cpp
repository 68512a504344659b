// Logit soft-capping (ForwardOptions::softcap) in every family on this GPU against the float64
// reference: mild capping, heavy capping of large logits, causal rows, rows that see no key, GQA,
// and decode shapes (the decode families, split-KV included).
#include <doctest/doctest.h>

#include <optional>
#include <vector>

#include "forward_case.hpp"
#include "gpu.hpp"

using namespace flashjit;
using namespace flashjit::test;

namespace {

std::vector<ForwardCase> softcap_cases() {
  std::vector<ForwardCase> cases;
  for (int d : {64, 128, 256})
    for (bool causal : {false, true}) {
      ForwardCase mild{2, 4, 2, 200, 200, d, causal};
      mild.softcap = 30.f;  // Gemma 2's attention cap: scores of unit inputs barely bend
      cases.push_back(mild);
      ForwardCase heavy{1, 4, 4, 150, 333, d, causal};
      heavy.softcap = 5.f, heavy.input_scale = 3.0;  // scores ~ 9 sd: most are capped
      cases.push_back(heavy);
    }
  for (int d : {64, 128, 256}) {
    // More queries than keys, causal (bottom-right): rows 0..179 see no key and must come out 0
    // with LSE -inf, beside rows that see some in the same tiles (Hopper's FMA-pipe exp2 turns a
    // masked score into 2^-125, not 0).
    ForwardCase empty_rows{1, 4, 2, 300, 120, d, true};
    empty_rows.softcap = 30.f;
    cases.push_back(empty_rows);
  }
  ForwardCase decode{4, 32, 8, 1, 2000, 128, false};  // split-KV decode
  decode.softcap = 20.f, decode.input_scale = 2.0;
  cases.push_back(decode);
  ForwardCase spec{2, 32, 8, 4, 777, 128, true};
  spec.softcap = 10.f, spec.input_scale = 2.0;
  cases.push_back(spec);
  // A cap past the bound of Hopper's max-free softmax (softcap · log2 e > 79): the running max.
  ForwardCase wide{1, 4, 2, 256, 300, 128, true};
  wide.softcap = 100.f, wide.input_scale = 20.0;
  cases.push_back(wide);
  ForwardCase huge{1, 2, 2, 64, 128, 128, false};
  huge.softcap = 50.f, huge.input_scale = 100.0;  // q·k of 1e4 and more: tanh saturates, no NaN
  cases.push_back(huge);
  return cases;
}

}  // namespace

TEST_CASE("soft-capped forward matches the float64 reference for every family on this GPU") {
  check_variant_against_plain(
      softcap_cases(), ".softcap",
      [](ForwardCase c) {
        c.softcap = 0.f;
        return c;
      },
      777);
}

// The tile table is keyed on seqlen_k, so the small problems above never reach the shapes chosen
// for long sequences. Forced tiles take every default bf16 wgmma shape, the ones with Hopper's
// max-free softmax among them: 128-row tiles sum P in fp32, 192-row causal ones its bf16
// fragments (kernels_src/wgmma/kernel.cu, kBoundedSumsBf16).
TEST_CASE("soft-capped wgmma in every default bf16 tile shape matches the float64 reference") {
  if (shared_engine().device().arch != "sm_90a") {
    MESSAGE("not an sm_90a GPU: soft-capped wgmma tile shapes not run");
    return;
  }
  unsigned seed = 900;
  for (const Variant& v : default_variants("sm_90a")) {
    if (v.family != "wgmma" || v.varlen || v.paged || v.dtype != DType::bf16) continue;
    ForwardCase c{1, 2, 1, 333, 517, v.head_dim, v.causal, v.dtype};
    c.softcap = 30.f;
    const TileConfig tiles{v.tile_m, v.tile_n, v.stages};
    const ForwardCheck check = run_forward_case(shared_engine(), c, "wgmma", seed++, tiles);
    INFO(check.variant, " on ", c.describe());
    CHECK(check.variant.ends_with(".softcap"));
    CHECK(check.all_written);
    check_within_bounds(check, c.dtype);
  }
}

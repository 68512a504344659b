// Variant names: round trip, and parse errors that name the wrong field.
#include <doctest/doctest.h>

#include <string>

#include "flashjit/flashjit.hpp"

using namespace flashjit;

namespace {

// Backward's kernels take none of the forward's score modifications (softcap, window, sink,
// ALiBi): the twins below are of the forward's default variants only.
bool is_backward(const Variant& v) {
  for (const FamilyInfo& family : families())
    if (family.name == v.family) return family.backward;
  return false;
}

}  // namespace

namespace {

// The backward's gradient kernels (dK/dV and dQ families) recompute the forward's scores, so they
// build its score variants (softcap, window, ALiBi); its row passes do not.
bool recomputes_scores(const flashjit::FamilyInfo& family) {
  return family.backward && family.name != "bwd_prep" && family.name != "bwd_convert" &&
         family.name != "bwd_sink";
}

}  // namespace

TEST_CASE("every default variant's name parses back to the same variant") {
  for (const char* arch : {"sm_80", "sm_86", "sm_89", "sm_90", "sm_90a", "sm_120"}) {
    const auto variants = default_variants(arch);
    REQUIRE(!variants.empty());
    for (const Variant& v : variants) {
      INFO(v.name());
      CHECK(Variant::parse(v.name()) == v);
    }
  }
}

TEST_CASE("a name reads as its fields") {
  const Variant v = Variant::parse("simt.sm90a.fp16.d256.m64n64s1.causal");
  CHECK(v.family == "simt");
  CHECK(v.arch == "sm_90a");
  CHECK(v.dtype == DType::fp16);
  CHECK(v.head_dim == 256);
  CHECK(v.tile_m == 64);
  CHECK(v.tile_n == 64);
  CHECK(v.stages == 1);
  CHECK(v.causal);
  CHECK_FALSE(Variant::parse("simt.sm80.bf16.d64.m64n64s1").causal);
  CHECK_FALSE(v.softcap);
}

TEST_CASE("soft-capped variants: a .softcap suffix, last, on every attention family") {
  const Variant capped = Variant::parse("wgmma.sm90a.bf16.d128.m128n176s2.causal.varlen.softcap");
  CHECK(capped.softcap);
  CHECK(capped.varlen);
  CHECK(capped.name() == "wgmma.sm90a.bf16.d128.m128n176s2.causal.varlen.softcap");
  for (const FamilyInfo& family : families())
    CHECK(family.softcap == (family.attention || recomputes_scores(family)));
  for (const Variant& v : default_variants("sm_90a")) {
    if (v.family == "merge" || is_backward(v)) continue;
    Variant with_cap = v;
    with_cap.softcap = true;
    INFO(with_cap.name());
    CHECK(Variant::parse(with_cap.name()) == with_cap);
  }
  // Suffix order is fixed, so a variant has one name; merge kernels have no scores to cap.
  CHECK_THROWS_WITH_AS(
      Variant::parse("simt.sm90a.bf16.d128.m64n64s1.softcap.causal"),
      doctest::Contains("causal, paged, varlen, softcap, window, sink, alibi, user<hash> (in that order"),
      Error);
  CHECK_THROWS_WITH_AS(Variant::parse("merge.sm90a.bf16.d128.m4n1s1.softcap"),
                       doctest::Contains("no soft-capped variants"), Error);
}

namespace {
std::string parse_error(const std::string& name) {
  try {
    Variant::parse(name);
  } catch (const Error& e) {
    CHECK(e.code() == ErrorCode::invalid_argument);
    return e.what();
  }
  return "(parsed)";
}
}  // namespace

TEST_CASE("parse errors say which field is wrong") {
  CHECK(parse_error("simt.sm90a.bf16.d128") .find("expected <family>") != std::string::npos);
  CHECK(parse_error("fast.sm90a.bf16.d128.m64n64s1").find("family field") != std::string::npos);
  CHECK(parse_error("simt.gfx90.bf16.d128.m64n64s1").find("arch field") != std::string::npos);
  CHECK(parse_error("simt.sm_90a.bf16.d128.m64n64s1").find("arch field") != std::string::npos);
  CHECK(parse_error("simt.sm91.bf16.d128.m64n64s1").find("arch field") != std::string::npos);
  CHECK(parse_error("simt.sm90a.fp8.d128.m64n64s1").find("dtype field") != std::string::npos);
  CHECK(parse_error("simt.sm90a.bf16.128.m64n64s1").find("head_dim field") != std::string::npos);
  CHECK(parse_error("simt.sm90a.bf16.dx.m64n64s1").find("head_dim field") != std::string::npos);
  CHECK(parse_error("simt.sm90a.bf16.d128.m64n64").find("tiles field") != std::string::npos);
  CHECK(parse_error("simt.sm90a.bf16.d128.m64n64s1x").find("tiles field") != std::string::npos);
  CHECK(parse_error("simt.sm90a.bf16.d128.m0n64s1").find("tiles field") != std::string::npos);
  CHECK(parse_error("simt.sm90a.bf16.d128.m64n64s1.causa").find("features field") != std::string::npos);
  CHECK(parse_error("simt.sm90a.bf16.d100.m64n64s1").find("head_dim 100") != std::string::npos);
  CHECK(parse_error("simt.sm90a.bf16.d128.m64n64s2").find("stages must be 1") != std::string::npos);
  CHECK(parse_error("simt.sm75.bf16.d128.m64n64s1").find("arch field") != std::string::npos);
}

TEST_CASE("arch spellings normalize; unknown ones list the valid ones") {
  CHECK(normalize_arch("sm_90a") == "sm_90a");
  CHECK(normalize_arch("sm_90") == "sm_90");
  CHECK(normalize_arch("90") == "sm_90a");
  CHECK(normalize_arch("9.0") == "sm_90a");
  CHECK(normalize_arch("H100") == "sm_90a");
  CHECK(normalize_arch("h200") == "sm_90a");
  CHECK(normalize_arch("a100") == "sm_80");
  CHECK(normalize_arch("sm86") == "sm_86");
  CHECK(normalize_arch("120") == "sm_120");
  try {
    normalize_arch("sm_42");
    FAIL("sm_42 accepted");
  } catch (const Error& e) {
    CHECK(std::string(e.what()).find("sm_90a") != std::string::npos);
  }
}

TEST_CASE("sliding-window variants: a .window suffix, last, on the families that build them") {
  const Variant windowed = Variant::parse("mma.sm80.bf16.d128.m128n64s2.causal.softcap.window");
  CHECK(windowed.window);
  CHECK(windowed.softcap);
  CHECK(windowed.causal);
  CHECK(windowed.name() == "mma.sm80.bf16.d128.m128n64s2.causal.softcap.window");
  CHECK_FALSE(Variant::parse("mma.sm80.bf16.d128.m128n64s2.causal").window);
  for (const FamilyInfo& family : families()) {
    INFO(family.name);
    // Every attention family but simt (the portable fallback) builds window kernels.
    CHECK(family.window == ((family.name != "simt" && family.name != "merge" && !family.backward) ||
                            recomputes_scores(family)));
  }
  for (const Variant& v : default_variants("sm_90a")) {
    if (v.family == "simt" || v.family == "merge" || is_backward(v)) continue;
    Variant with_window = v;
    with_window.window = true;
    INFO(with_window.name());
    CHECK(Variant::parse(with_window.name()) == with_window);
  }
  CHECK_THROWS_WITH_AS(Variant::parse("mma.sm80.bf16.d128.m128n64s2.window.causal"),
                       doctest::Contains("(in that order, each once)"), Error);
  CHECK_THROWS_WITH_AS(Variant::parse("simt.sm90a.bf16.d128.m64n64s1.window"),
                       doctest::Contains("no sliding-window variants"), Error);
}

TEST_CASE("attention-sink variants: a .sink suffix, last, on the families that build them") {
  const Variant sunk =
      Variant::parse("wgmma.sm90a.bf16.d128.m128n176s2.causal.softcap.window.sink");
  CHECK(sunk.sink);
  CHECK(sunk.window);
  CHECK(sunk.softcap);
  CHECK(sunk.name() == "wgmma.sm90a.bf16.d128.m128n176s2.causal.softcap.window.sink");
  CHECK(Variant::parse("decode_tma.sm90a.bf16.d128.m16n64s3.paged.sink").paged);
  CHECK_FALSE(Variant::parse("mma.sm80.bf16.d128.m128n64s2.causal.window").sink);
  for (const FamilyInfo& family : families()) {
    INFO(family.name);
    // Every attention family but simt (the portable fallback) builds sink kernels.
    CHECK(family.sink == (family.attention && family.name != "simt"));
  }
  for (const Variant& v : default_variants("sm_90a")) {
    if (v.family == "simt" || v.family == "merge" || is_backward(v)) continue;
    Variant with_sink = v;
    with_sink.sink = true;
    INFO(with_sink.name());
    CHECK(with_sink.name().ends_with(".sink"));
    CHECK(Variant::parse(with_sink.name()) == with_sink);
  }
  CHECK_THROWS_WITH_AS(Variant::parse("mma.sm80.bf16.d128.m128n64s2.sink.window"),
                       doctest::Contains("(in that order, each once)"), Error);
  CHECK_THROWS_WITH_AS(Variant::parse("mma.sm80.bf16.d128.m128n64s2.sink.sink"),
                       doctest::Contains("window, sink, alibi, user<hash> (in that order, each once)"), Error);
  CHECK_THROWS_WITH_AS(Variant::parse("simt.sm90a.bf16.d128.m64n64s1.sink"),
                       doctest::Contains("family simt has no sink variants"), Error);
  CHECK_THROWS_WITH_AS(Variant::parse("merge.sm90a.bf16.d128.m4n1s1.sink"),
                       doctest::Contains("no sink variants"), Error);
}

TEST_CASE("ALiBi variants: an .alibi suffix, last, on the families that build them") {
  const Variant biased =
      Variant::parse("wgmma.sm90a.bf16.d128.m128n176s2.causal.varlen.softcap.window.sink.alibi");
  CHECK(biased.alibi);
  CHECK(biased.sink);
  CHECK(biased.window);
  CHECK(biased.softcap);
  CHECK(biased.varlen);
  CHECK(biased.name() == "wgmma.sm90a.bf16.d128.m128n176s2.causal.varlen.softcap.window.sink.alibi");
  const Variant paged = Variant::parse("decode_tma.sm90a.bf16.d128.m16n64s3.paged.alibi");
  CHECK(paged.paged);
  CHECK(paged.alibi);
  CHECK_FALSE(paged.sink);
  CHECK(Variant::parse("mma.sm80.fp16.d64.m128n64s2.window.alibi").window);
  CHECK_FALSE(Variant::parse("mma.sm80.bf16.d128.m128n64s2.causal.sink").alibi);
  for (const FamilyInfo& family : families()) {
    INFO(family.name);
    // The families that build sinks build ALiBi: every attention family but simt.
    CHECK(family.alibi == ((family.attention && family.name != "simt") || recomputes_scores(family)));
  }
  for (const char* arch : {"sm_80", "sm_90a"})
    for (const Variant& v : default_variants(arch)) {
      if (v.family == "simt" || v.family == "merge" || is_backward(v)) continue;
      Variant with_alibi = v;
      with_alibi.alibi = true;
      INFO(with_alibi.name());
      CHECK(with_alibi.name().ends_with(".alibi"));
      CHECK(Variant::parse(with_alibi.name()) == with_alibi);
      with_alibi.sink = with_alibi.window = true;
      CHECK(with_alibi.name().ends_with(".window.sink.alibi"));
      CHECK(Variant::parse(with_alibi.name()) == with_alibi);
    }
  CHECK_THROWS_WITH_AS(Variant::parse("mma.sm80.bf16.d128.m128n64s2.alibi.sink"),
                       doctest::Contains("(in that order, each once)"), Error);
  CHECK_THROWS_WITH_AS(Variant::parse("mma.sm80.bf16.d128.m128n64s2.alibi.alibi"),
                       doctest::Contains("sink, alibi, user<hash> (in that order, each once)"), Error);
  CHECK_THROWS_WITH_AS(Variant::parse("simt.sm90a.bf16.d128.m64n64s1.alibi"),
                       doctest::Contains("family simt has no ALiBi variants"), Error);
  CHECK_THROWS_WITH_AS(Variant::parse("merge.sm90a.bf16.d128.m4n1s1.alibi"),
                       doctest::Contains("no ALiBi variants"), Error);
}

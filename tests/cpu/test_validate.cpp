// Bad forward arguments are rejected, naming the argument and what was expected.
#include <doctest/doctest.h>

#include <cmath>
#include <cstdint>
#include <limits>
#include <string>
#include <utility>

#include "flashjit/flashjit.hpp"
#include "api/dispatch.hpp"
#include "api/validate.hpp"
#include "user_examples.hpp"

using namespace flashjit;

namespace {

// Aligned addresses that are never dereferenced: validation happens before any launch.
void* fake(std::uintptr_t address) { return reinterpret_cast<void*>(address); }

struct Args {
  TensorView q = TensorView::bshd(fake(0x100000), DType::bf16, 2, 128, 8, 128);
  TensorView k = TensorView::bshd(fake(0x200000), DType::bf16, 2, 256, 2, 128);
  TensorView v = TensorView::bshd(fake(0x300000), DType::bf16, 2, 256, 2, 128);
  TensorView out = TensorView::bshd(fake(0x400000), DType::bf16, 2, 128, 8, 128);
  ForwardOptions options;
};

// One query per sequence over 8192 keys, GQA 4:1: the shape of a decode step.
Args decode_step() {
  Args step;
  step.q = TensorView::bshd(fake(0x100000), DType::bf16, 2, 1, 8, 128);
  step.out = TensorView::bshd(fake(0x400000), DType::bf16, 2, 1, 8, 128);
  step.k = TensorView::bshd(fake(0x200000), DType::bf16, 2, 8192, 2, 128);
  step.v = TensorView::bshd(fake(0x300000), DType::bf16, 2, 8192, 2, 128);
  return step;
}

DeviceInfo h200() {
  DeviceInfo d;
  d.arch = "sm_90a", d.multiprocessors = 132, d.max_shared_per_block_optin = 232448;
  return d;
}

DeviceInfo a100() {
  DeviceInfo d;
  d.arch = "sm_80", d.multiprocessors = 108, d.max_shared_per_block_optin = 166912;
  return d;
}

// The variants an H200 picks for a prefill (default Args) and for a causal decode step, both with
// `with_variant` applied to their options.
template <typename Modify>
std::pair<Variant, Variant> hopper_prefill_and_decode(Modify with_variant) {
  Args a;
  with_variant(a.options);
  Args step = decode_step();
  step.options.causal = true;
  with_variant(step.options);
  return {detail::select_variant(detail::validate_forward(a.q, a.k, a.v, a.out, a.options),
                                 h200(), nullptr),
          detail::select_variant(
              detail::validate_forward(step.q, step.k, step.v, step.out, step.options), h200(),
              nullptr)};
}

std::string rejection(const Args& a) {
  try {
    detail::validate_forward(a.q, a.k, a.v, a.out, a.options);
  } catch (const Error& e) {
    CHECK(e.code() == ErrorCode::invalid_argument);
    return e.what();
  }
  return "(accepted)";
}

bool mentions(const std::string& text, const std::string& part) {
  return text.find(part) != std::string::npos;
}

}  // namespace

TEST_CASE("valid arguments pass and fill the kernel params") {
  Args a;
  const auto problem = detail::validate_forward(a.q, a.k, a.v, a.out, a.options);
  CHECK(problem.params.heads_per_kv == 4);
  CHECK(problem.params.q_stride_s == 8 * 128);
  CHECK(problem.softmax_scale == doctest::Approx(1.0 / std::sqrt(128.0)));
  a.q = TensorView::bhsd(fake(0x100000), DType::bf16, 2, 128, 8, 128);  // BHSD is fine too
  CHECK(detail::validate_forward(a.q, a.k, a.v, a.out, a.options).params.q_stride_h == 128 * 128);
}

TEST_CASE("a softcap passes its scores to the kernel already scaled, and picks capped variants") {
  Args a;
  a.options.softcap = 30.f;
  const auto problem = detail::validate_forward(a.q, a.k, a.v, a.out, a.options);
  CHECK(problem.softcap == 30.f);
  CHECK(problem.params.softcap == 30.f);
  CHECK(problem.params.softcap_scale == doctest::Approx(1.0 / std::sqrt(128.0) / 30.0));
  CHECK(problem.params.softmax_scale == 1.f);  // the LSE of capped scores is in their own units
  CHECK(problem.params.scale_log2 == doctest::Approx(1.4426950408889634));
  const Variant v = detail::select_variant(problem, h200(), nullptr);
  CHECK(v.softcap);
  CHECK(v.family == "wgmma");
  a.options.softcap = 0.f;
  CHECK_FALSE(
      detail::select_variant(detail::validate_forward(a.q, a.k, a.v, a.out, a.options), h200(),
                             nullptr)
          .softcap);
}

TEST_CASE("each bad input is named") {
  Args a;
  SUBCASE("null pointers") {
    a.k.data = nullptr;
    CHECK(mentions(rejection(a), "k.data is null"));
  }
  SUBCASE("dtype mismatch") {
    a.v.dtype = DType::fp16;
    CHECK(mentions(rejection(a), "v.dtype is fp16, expected bf16"));
  }
  SUBCASE("out shape mismatch") {
    a.out.shape[1] = 127;
    CHECK(mentions(rejection(a), "out.shape[1] (seqlen) is 127: expected 128"));
  }
  SUBCASE("out's elements overlap (each would be written twice)") {
    a.out.stride[1] = a.out.stride[2];  // every row on the same memory as the next head
    CHECK(mentions(rejection(a), "has elements that share memory"));
    CHECK(mentions(rejection(a), "expected an output view with no overlap"));
  }
  SUBCASE("an input may overlap itself (one K/V row for every key), an output not") {
    a.k.stride[1] = 8;
    a.v.stride[1] = 8;
    CHECK(rejection(a) == "(accepted)");
  }
  SUBCASE("batch mismatch") {
    a.k.shape[0] = 3;
    CHECK(mentions(rejection(a), "k.shape[0] (batch) is 3"));
  }
  SUBCASE("k/v shape mismatch") {
    a.v.shape[1] = 255;
    CHECK(mentions(rejection(a), "v.shape[1] (seqlen) is 255"));
  }
  SUBCASE("unsupported head_dim") {
    for (TensorView* t : {&a.q, &a.k, &a.v, &a.out}) t->shape[3] = 80;
    CHECK(mentions(rejection(a), "head_dim (q.shape[3]) is 80: expected one of 32, 64"));
  }
  SUBCASE("heads not a multiple") {
    a.k.shape[2] = a.v.shape[2] = 3;
    CHECK(mentions(rejection(a), "q heads (8) is not a multiple of k/v heads (3)"));
  }
  SUBCASE("misaligned pointer") {
    a.q.data = fake(0x100008);
    CHECK(mentions(rejection(a), "q.data (0x100008) is not 16-byte aligned"));
  }
  SUBCASE("misaligned stride") {
    a.k.stride[1] = 2 * 128 + 4;
    CHECK(mentions(rejection(a), "k.stride[1] (seqlen) is 260 elements: expected a multiple of 8"));
  }
  SUBCASE("head_dim not contiguous") {
    a.out.stride[3] = 2;
    CHECK(mentions(rejection(a), "out.stride[3] (head_dim) is 2: expected 1"));
  }
  SUBCASE("negative size") {
    a.q.shape[0] = a.out.shape[0] = -1;
    CHECK(mentions(rejection(a), "q.shape[0] (batch) is -1"));
  }
  SUBCASE("no keys") {
    a.k.shape[1] = a.v.shape[1] = 0;
    CHECK(mentions(rejection(a), "seqlen_k) is 0"));
  }
  SUBCASE("bad softmax scale") {
    a.options.softmax_scale = std::numeric_limits<float>::infinity();
    CHECK(mentions(rejection(a), "softmax_scale is inf"));
  }
  SUBCASE("bad window") {
    a.options.window_left = -2;
    CHECK(mentions(rejection(a), "window_left / window_right are -2 / -1: expected -1 (unbounded) "
                                 "or >= 0"));
    a.options.window_left = 16, a.options.window_right = -7;
    CHECK(mentions(rejection(a), "window_left / window_right are 16 / -7"));
    a.options.causal = true, a.options.window_right = 4;
    CHECK(mentions(rejection(a), "window_right is 4 with causal: expected -1 or 0"));
  }
  SUBCASE("bad softcap") {
    a.options.softcap = -1.f;
    CHECK(mentions(rejection(a), "softcap is -1: expected 0 (off) or a finite value > 0"));
    a.options.softcap = std::numeric_limits<float>::quiet_NaN();
    CHECK(mentions(rejection(a), "softcap is nan"));
    a.options.softcap = std::numeric_limits<float>::infinity();
    CHECK(mentions(rejection(a), "softcap is inf"));
    a.options.softcap = 1e-45f;  // the scale divided by it is not finite
    CHECK(mentions(rejection(a), "softcap is 1e-45"));
  }
  SUBCASE("misaligned lse") {
    a.options.lse = static_cast<float*>(fake(0x500002));
    CHECK(mentions(rejection(a), "lse is not 4-byte aligned"));
  }
  SUBCASE("misaligned sink_logits") {
    a.options.sink_logits = static_cast<const float*>(fake(0x600002));
    CHECK(
        mentions(rejection(a),
                 "sink_logits is not 4-byte aligned: expected a device buffer of heads_q floats"));
  }
  SUBCASE("misaligned alibi_slopes") {
    a.options.alibi_slopes = static_cast<const float*>(fake(0x700002));
    CHECK(mentions(
        rejection(a),
        "alibi_slopes is not 4-byte aligned: expected a device buffer of heads_q floats"));
  }
}

// Found by tests/fuzz/fuzz_forward_args: each of these was accepted, and would have overflowed
// in validation itself (the stride) or in the kernel's addressing and exponent.
TEST_CASE("strides and scales past what a kernel can compute with are rejected") {
  Args a;
  SUBCASE("a stride whose byte offsets pass 2^63") {
    a.k.stride[0] = std::int64_t{1} << 62;  // positive and a multiple of 8: only its size is wrong
    CHECK(mentions(rejection(a), "k: shape 2 x 256 x 2 x 128 with strides"));
  }
  SUBCASE("the largest stride that is a multiple of 8") {
    a.v.stride[1] = std::numeric_limits<std::int64_t>::max() - 7;
    CHECK(mentions(rejection(a), "reaches past 2^63 bytes"));
  }
  SUBCASE("a softmax scale whose product with log2(e) is not finite") {
    a.options.softmax_scale = 3e38f;
    CHECK(mentions(rejection(a), "softmax_scale is 3e+38"));
    a.options.softmax_scale = 2e38f;  // still finite in base 2
    CHECK(rejection(a) == "(accepted)");
  }
}

TEST_CASE("zero batch, heads or seqlen_q is an empty problem (a documented no-op)") {
  Args a;
  a.q.shape[1] = a.out.shape[1] = 0;
  CHECK(detail::validate_forward(a.q, a.k, a.v, a.out, a.options).empty());
  Args b;
  b.q.shape[0] = b.out.shape[0] = b.k.shape[0] = b.v.shape[0] = 0;
  CHECK(detail::validate_forward(b.q, b.k, b.v, b.out, b.options).empty());
}

TEST_CASE("the Engine reports a missing driver or GPU clearly") {
  try {
    Engine engine(0);
    MESSAGE("a GPU is present; nothing to check here");
  } catch (const Error& e) {
    CHECK((e.code() == ErrorCode::no_driver || e.code() == ErrorCode::no_device));
    const std::string text = e.what();
    CHECK((mentions(text, "no CUDA driver found") || mentions(text, "no CUDA device")));
  }
}

TEST_CASE("a sliding window reaches the kernel as two bounds, and picks window variants") {
  Args a;
  SUBCASE("no window: both sides -1, or causal with only window_right 0") {
    CHECK_FALSE(detail::validate_forward(a.q, a.k, a.v, a.out, a.options).window);
    a.options.causal = true, a.options.window_right = 0;
    CHECK_FALSE(detail::validate_forward(a.q, a.k, a.v, a.out, a.options).window);
  }
  SUBCASE("both sides") {
    a.options.window_left = 100, a.options.window_right = 7;
    const auto problem = detail::validate_forward(a.q, a.k, a.v, a.out, a.options);
    CHECK(problem.window);
    CHECK(problem.params.window_left == 100);
    CHECK(problem.params.window_right == 7);
    const Variant v = detail::select_variant(problem, a100(), nullptr);
    CHECK(v.window);
    CHECK(v.family == "mma");
  }
  SUBCASE("an unbounded side is kUnboundedWindow; causal bounds the right at the diagonal") {
    a.options.window_right = 3;
    auto problem = detail::validate_forward(a.q, a.k, a.v, a.out, a.options);
    CHECK(problem.params.window_left == kUnboundedWindow);
    CHECK(problem.params.window_right == 3);
    a.options.window_left = 64, a.options.window_right = -1, a.options.causal = true;
    problem = detail::validate_forward(a.q, a.k, a.v, a.out, a.options);
    CHECK(problem.window);
    CHECK(problem.params.window_left == 64);
    CHECK(problem.params.window_right == 0);
  }
  SUBCASE("on sm_90a a window prefill runs on wgmma, a windowed decode step on decode_tma") {
    a.options.window_left = 32;
    const Variant v = detail::select_variant(
        detail::validate_forward(a.q, a.k, a.v, a.out, a.options), h200(), nullptr);
    CHECK(v.family == "wgmma");
    CHECK(v.window);
    // One query per sequence over 8192 keys, 100 keys back: decode_tma, and split-KV divides the
    // band's tiles (two of 64 keys, plus one for its misalignment), not the cache's 128.
    Args step = decode_step();
    step.options.causal = true, step.options.window_left = 100;
    const auto decode = detail::validate_forward(step.q, step.k, step.v, step.out, step.options);
    const Variant d = detail::select_variant(decode, h200(), nullptr);
    CHECK(d.family == "decode_tma");
    CHECK(d.window);
    CHECK(decode.key_tiles_seen(64) == 3);
    CHECK(decode.key_tiles_seen(8192) == 1);
    step.options.window_left = -1;
    CHECK(detail::validate_forward(step.q, step.k, step.v, step.out, step.options)
              .key_tiles_seen(64) == 128);
  }
}

TEST_CASE("attention sinks reach the kernel as a pointer, and pick sink variants") {
  Args a;
  const auto plain = detail::validate_forward(a.q, a.k, a.v, a.out, a.options);
  CHECK_FALSE(plain.sink);
  CHECK(plain.params.sink_logits == nullptr);
  SUBCASE("sink_logits set: problem.sink and the params' pointer, nothing else changed") {
    a.options.sink_logits = static_cast<const float*>(fake(0x600004));
    const auto problem = detail::validate_forward(a.q, a.k, a.v, a.out, a.options);
    CHECK(problem.sink);
    CHECK(problem.params.sink_logits == static_cast<const float*>(fake(0x600004)));
    CHECK_FALSE(problem.window);
    CHECK(problem.softcap == 0.f);
    CHECK(problem.softmax_scale == plain.softmax_scale);
    CHECK(problem.params.scale_log2 == plain.params.scale_log2);
    CHECK(problem.params.heads_per_kv == plain.params.heads_per_kv);
    const Variant v = detail::select_variant(problem, a100(), nullptr);
    CHECK(v.sink);
    CHECK(v.family == "mma");
    CHECK_FALSE(detail::select_variant(plain, a100(), nullptr).sink);
  }
  SUBCASE("simt has no sinks: forcing it names why") {
    a.options.sink_logits = static_cast<const float*>(fake(0x600004));
    const auto problem = detail::validate_forward(a.q, a.k, a.v, a.out, a.options);
    CHECK_THROWS_WITH_AS(
        detail::select_variant(problem, a100(), detail::forced_family(std::string("simt"))),
        doctest::Contains("has no attention sinks"), Error);
  }
  SUBCASE("on sm_90a a sink prefill runs on wgmma, a decode step with sinks on decode_tma") {
    const auto [v, d] = hopper_prefill_and_decode([](ForwardOptions& o) {
      o.sink_logits = static_cast<const float*>(fake(0x600004));
    });
    CHECK(v.family == "wgmma");
    CHECK(v.sink);
    CHECK(d.family == "decode_tma");
    CHECK(d.sink);
  }
}

TEST_CASE("ALiBi reaches the kernel as a pointer, and picks ALiBi variants") {
  Args a;
  const auto plain = detail::validate_forward(a.q, a.k, a.v, a.out, a.options);
  CHECK_FALSE(plain.alibi);
  CHECK(plain.params.alibi_slopes == nullptr);
  const auto* slopes = static_cast<const float*>(fake(0x700004));
  SUBCASE("alibi_slopes set: problem.alibi and the params' pointer, nothing else changed") {
    a.options.alibi_slopes = slopes;
    const auto problem = detail::validate_forward(a.q, a.k, a.v, a.out, a.options);
    CHECK(problem.alibi);
    CHECK(problem.params.alibi_slopes == slopes);
    CHECK_FALSE(problem.sink);
    CHECK(problem.params.sink_logits == nullptr);
    CHECK_FALSE(problem.window);
    CHECK(problem.softcap == 0.f);
    CHECK(problem.params.scale_log2 == plain.params.scale_log2);
    const Variant v = detail::select_variant(problem, a100(), nullptr);
    CHECK(v.alibi);
    CHECK_FALSE(v.sink);
    CHECK(v.family == "mma");
    CHECK_FALSE(detail::select_variant(plain, a100(), nullptr).alibi);
  }
  SUBCASE("with sinks, a window and soft-capping: one variant with all four") {
    a.options.alibi_slopes = slopes;
    a.options.sink_logits = static_cast<const float*>(fake(0x600004));
    a.options.window_left = 32, a.options.softcap = 30.f, a.options.causal = true;
    const Variant v = detail::select_variant(
        detail::validate_forward(a.q, a.k, a.v, a.out, a.options), a100(), nullptr);
    CHECK(v.family == "mma");
    CHECK(v.name().ends_with(".causal.softcap.window.sink.alibi"));
  }
  SUBCASE("simt has no ALiBi: forcing it names why") {
    a.options.alibi_slopes = slopes;
    const auto problem = detail::validate_forward(a.q, a.k, a.v, a.out, a.options);
    CHECK_THROWS_WITH_AS(
        detail::select_variant(problem, a100(), detail::forced_family(std::string("simt"))),
        doctest::Contains("has no ALiBi"), Error);
  }
  SUBCASE("on sm_90a an ALiBi prefill runs on wgmma, a decode step with ALiBi on decode_tma") {
    const auto [v, d] =
        hopper_prefill_and_decode([&](ForwardOptions& o) { o.alibi_slopes = slopes; });
    CHECK(v.family == "wgmma");
    CHECK(v.alibi);
    CHECK(d.family == "decode_tma");
    CHECK(d.alibi);
  }
}

TEST_CASE("sink tokens ride in the window variants, and split-KV counts their tiles") {
  Args a;
  CHECK(detail::validate_forward(a.q, a.k, a.v, a.out, a.options).params.sink_tokens == 0);
  SUBCASE("a negative count, or no bounded left side, is named") {
    a.options.sink_tokens = -1, a.options.window_left = 64;
    CHECK(mentions(rejection(a), "sink_tokens is -1: expected 0 (none) or more"));
    a.options.sink_tokens = 4, a.options.window_left = -1;
    CHECK(mentions(rejection(a), "sink_tokens is 4 with window_left -1: sink tokens need a "
                                 "sliding window bounded on the left (window_left >= 0)"));
    a.options.window_right = 16;  // a window, but unbounded on the left: the sinks are in it
    CHECK(mentions(rejection(a), "sink_tokens is 4 with window_left -1"));
  }
  SUBCASE("with a window: the same window variant, the count in the params") {
    a.options.window_left = 64, a.options.causal = true;
    const auto windowed = detail::validate_forward(a.q, a.k, a.v, a.out, a.options);
    a.options.sink_tokens = 4;
    const auto problem = detail::validate_forward(a.q, a.k, a.v, a.out, a.options);
    CHECK(problem.window);
    CHECK(problem.params.sink_tokens == 4);
    CHECK(problem.params.window_left == 64);
    CHECK(problem.params.window_right == 0);
    const Variant v = detail::select_variant(problem, h200(), nullptr);
    CHECK(v == detail::select_variant(windowed, h200(), nullptr));
    CHECK(v.name().ends_with(".causal.window"));
  }
  SUBCASE("key_tiles_seen: the band's tiles and the sinks', each tile once") {
    // One query over 8192 keys, 100 back: 3 band tiles of 64 (see the window test above).
    Args step = decode_step();
    step.options.causal = true, step.options.window_left = 100;
    auto tiles = [&](int sink_tokens, int tile_n) {
      step.options.sink_tokens = sink_tokens;
      return detail::validate_forward(step.q, step.k, step.v, step.out, step.options)
          .key_tiles_seen(tile_n);
    };
    CHECK(tiles(0, 64) == 3);
    CHECK(tiles(4, 64) == 4);       // one more tile at the start
    CHECK(tiles(64, 64) == 4);      // exactly one tile of sinks
    CHECK(tiles(65, 64) == 5);      // the sinks spill into a second tile
    CHECK(tiles(200, 64) == 7);     // 4 tiles of sinks, bigger than a tile
    CHECK(tiles(8000, 64) == 128);  // the sinks reach the band: every tile, once
    CHECK(tiles(1 << 30, 64) == 128);
    CHECK(tiles(4, 8192) == 1);     // sinks and band in one tile
    // A short cache that the band already covers: the sinks add nothing.
    step.k.shape[1] = step.v.shape[1] = 150;
    CHECK(tiles(0, 64) == 3);
    CHECK(tiles(4, 64) == 3);
  }
}

TEST_CASE("user functions reach the kernel as a hash and args, and pick user variants") {
  const UserFunctions bias = test::relative_position_bias_functions();
  const UserFunctions documents = test::document_mask_functions();
  Args a;
  const auto plain = detail::validate_forward(a.q, a.k, a.v, a.out, a.options);
  CHECK(plain.user_functions.empty());
  const void* table = fake(0x800000);
  SUBCASE("a score_mod: its hash and args, scores in natural-log units") {
    a.options.user_functions = &bias;
    a.options.user_args[0] = table;
    const auto problem = detail::validate_forward(a.q, a.k, a.v, a.out, a.options);
    CHECK(problem.user_functions == bias.hash());
    CHECK(problem.score_mod);
    CHECK_FALSE(problem.mask_mod);
    CHECK(problem.params.user_args.ptr[0] == table);
    CHECK(problem.params.user_args.ptr[1] == nullptr);
    // score_mod sees softmax_scale · q·k: the kernel scales raw scores by user_score_scale, and
    // its softmax takes them as they are.
    CHECK(problem.params.user_score_scale == doctest::Approx(1.0 / std::sqrt(128.0)));
    CHECK(problem.params.softmax_scale == 1.f);
    CHECK(problem.params.scale_log2 == doctest::Approx(1.4426950408889634));
    a.options.softcap = 30.f;  // capped scores are already scaled
    CHECK(detail::validate_forward(a.q, a.k, a.v, a.out, a.options).params.user_score_scale == 1.f);
    const Variant v = detail::select_variant(problem, a100(), nullptr);
    CHECK(v.family == "mma");
    CHECK(v.user_functions == bias.hash());
    CHECK(v.name().ends_with(".user" + bias.hash()));
  }
  SUBCASE("a mask_mod alone leaves the scaling as it is") {
    a.options.user_functions = &documents;
    const auto problem = detail::validate_forward(a.q, a.k, a.v, a.out, a.options);
    CHECK(problem.mask_mod);
    CHECK_FALSE(problem.score_mod);
    CHECK(problem.params.softmax_scale == plain.params.softmax_scale);
    CHECK(problem.params.scale_log2 == plain.params.scale_log2);
  }
  SUBCASE("on sm_90a a prefill runs on wgmma, a decode step on decode_tma, both with the hash") {
    const auto [v, d] =
        hopper_prefill_and_decode([&](ForwardOptions& o) { o.user_functions = &documents; });
    CHECK(v.family == "wgmma");
    CHECK(v.user_functions == documents.hash());
    CHECK(d.family == "decode_tma");
    CHECK(d.user_functions == documents.hash());
  }
  SUBCASE("forced: mma builds user variants, simt has none and says so") {
    a.options.user_functions = &bias;
    const auto problem = detail::validate_forward(a.q, a.k, a.v, a.out, a.options);
    CHECK(detail::select_variant(problem, h200(), detail::forced_family(std::string("mma")))
              .user_functions == bias.hash());
    CHECK_THROWS_WITH_AS(
        detail::select_variant(problem, h200(), detail::forced_family(std::string("simt"))),
        doctest::Contains("has no user functions"), Error);
  }
  SUBCASE("user_args without user functions, a block mask without a mask_mod: named") {
    a.options.user_args[3] = table;
    CHECK(mentions(rejection(a), "user_args[3] is set without user_functions"));
    a.options.user_args[3] = nullptr;
    // Never dereferenced: refused before the mask is read.
    a.options.block_mask = reinterpret_cast<const BlockMask*>(fake(0x900000));
    CHECK(mentions(rejection(a), "block_mask is set without a mask_mod"));
    a.options.user_functions = &bias;  // a score_mod builds no block mask
    CHECK(mentions(rejection(a), "block_mask is set without a mask_mod"));
  }
}

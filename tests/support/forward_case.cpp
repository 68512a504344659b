#include "forward_case.hpp"

#include <doctest/doctest.h>
#include <fmt/format.h>
#include <fmt/ranges.h>

#include <cmath>
#include <random>

#include "flashjit/device_memory.hpp"
#include "gpu.hpp"
#include "reference.hpp"

namespace flashjit::test {

std::string ForwardCase::describe() const {
  return fmt::format("b{} hq{} hkv{} sq{} sk{} d{} {} {} {}{}{}{}{}{}", batch, heads_q, heads_kv,
                     seqlen_q, seqlen_k, head_dim, causal ? "causal" : "full", to_string(dtype),
                     bhsd ? "bhsd" : "bshd",
                     softcap > 0.f ? fmt::format(" softcap {} (q, k sd {})", softcap, input_scale)
                                   : "",
                     window_left >= 0 || window_right >= 0
                         ? fmt::format(" window ({}, {})", window_left, window_right)
                         : "",
                     sink_tokens > 0 ? fmt::format(" sink tokens {}", sink_tokens) : "",
                     sink_logits.empty() ? "" : fmt::format(" sinks {}", fmt::join(sink_logits, " ")),
                     alibi_slopes.empty() ? ""
                                          : fmt::format(" alibi {}", fmt::join(alibi_slopes, " ")));
}

DeviceProblem random_problem(const Engine& engine, const ForwardCase& c, unsigned seed) {
  std::mt19937 rng(seed);
  auto q = HostTensor::make(c.dtype, c.batch, c.seqlen_q, c.heads_q, c.head_dim, c.bhsd);
  auto k = HostTensor::make(c.dtype, c.batch, c.seqlen_k, c.heads_kv, c.head_dim, c.bhsd);
  auto v = HostTensor::make(c.dtype, c.batch, c.seqlen_k, c.heads_kv, c.head_dim, c.bhsd);
  q.fill_random(rng, c.input_scale);
  k.fill_random(rng, c.input_scale);
  v.fill_random(rng);
  return DeviceProblem(engine, std::move(q), std::move(k), std::move(v));
}

ScoreMods score_mods(const ForwardCase& c) {
  ScoreMods mods;
  mods.softcap = c.softcap;
  mods.window_left = c.window_left;
  mods.window_right = c.window_right;
  mods.sink_tokens = c.sink_tokens;
  mods.sink_logits.assign(c.sink_logits.begin(), c.sink_logits.end());
  mods.alibi_slopes.assign(c.alibi_slopes.begin(), c.alibi_slopes.end());
  return mods;
}

std::optional<ForwardCheck> run_if_supported(Engine& engine, const ForwardCase& c,
                                             const std::string& family, unsigned seed) {
  try {
    return run_forward_case(engine, c, family, seed);
  } catch (const Error& e) {
    if (e.code() == ErrorCode::unsupported)
      MESSAGE(fmt::format("{} not run on {}: {}", family, c.describe(), e.what()));
    else
      FAIL_CHECK(fmt::format("{} {}: {}", family, c.describe(), e.what()));
    return std::nullopt;
  }
}

int check_variant_against_plain(const std::vector<ForwardCase>& cases, const std::string& suffix,
                                ForwardCase (*plain)(ForwardCase), unsigned seed) {
  int ran_somewhere = 0;
  for (const std::string& family : family_names())
    for (const ForwardCase& c : cases) {
      const std::optional<ForwardCheck> without =
          run_if_supported(shared_engine(), plain(c), family, seed);
      if (!without) continue;
      CHECK_FALSE(without->variant.ends_with(suffix));
      const std::optional<ForwardCheck> ran = run_if_supported(shared_engine(), c, family, seed++);
      if (!ran) continue;
      ++ran_somewhere;
      CAPTURE(ran->variant);
      CAPTURE(c.describe());
      CHECK(ran->variant.ends_with(suffix));
      check_within_bounds(*ran, c.dtype);
    }
  return ran_somewhere;
}

void check_within_bounds(const ForwardErrors& errors, DType dtype) {
  const std::string failures = describe_failures(errors, dtype);
  CHECK_MESSAGE(failures.empty(), failures);
}

ForwardCheck run_forward_case(Engine& engine, const ForwardCase& c,
                              std::optional<std::string> family, unsigned seed,
                              std::optional<TileConfig> tiles) {
  const DeviceProblem problem = random_problem(engine, c, seed);
  ForwardOptions options;
  options.causal = c.causal;
  options.family = family;
  options.tiles = tiles;
  options.softcap = c.softcap;
  options.window_left = c.window_left;
  options.window_right = c.window_right;
  options.sink_tokens = c.sink_tokens;
  std::optional<DeviceBuffer> sinks, slopes;
  if (!c.sink_logits.empty()) {
    sinks.emplace(device_copy(engine, c.sink_logits));
    options.sink_logits = static_cast<const float*>(sinks->data());
  }
  if (!c.alibi_slopes.empty()) {
    slopes.emplace(device_copy(engine, c.alibi_slopes));
    options.alibi_slopes = static_cast<const float*>(slopes->data());
  }
  if (c.with_lse) options.lse = problem.lse();
  ForwardCheck check;
  check.variant =
      engine.select_variant(problem.q(), problem.k(), problem.v(), problem.out(), options).name();
  engine.forward(problem.q(), problem.k(), problem.v(), problem.out(), options);
  synchronize(engine);

  const double scale = 1.0 / std::sqrt(static_cast<double>(c.head_dim));
  const Reference ref = reference_attention(problem.host_q(), problem.host_k(), problem.host_v(),
                                            scale, c.causal, score_mods(c));
  const std::vector<float> lse = problem.lse_values();
  static_cast<ForwardErrors&>(check) =
      compare_forward(problem.output(), c.with_lse ? &lse : nullptr, ref);
  return check;
}

}  // namespace flashjit::test

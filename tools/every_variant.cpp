// flashjit_every_variant: launches every default variant of every family for this GPU on small
// problems with ragged sequence lengths and GQA (plus fully masked rows when causal), each tensor
// in an allocation of exactly its size, so that tools/sanitize.sh can run compute-sanitizer over
// all of the kernel code in one go. The backward families run through Engine::backward
// (every_variant_backward.cpp): each dK/dV variant on every problem, and the helpers (row passes,
// dQ kernels) inside those backwards. Exits non-zero on any error, any output or gradient left
// unwritten or non-finite, or a default variant that no problem reached. `flashjit_every_variant
// decode` runs only the families whose names start with "decode" (`bwd_` the backward's);
// `flashjit_every_variant "" softcap` the soft-capped twins of every attention variant instead
// (`window`, `sink`, `alibi`: those twins).
#include <fmt/format.h>
#include <fmt/ranges.h>

#include <cmath>
#include <cstdint>
#include <algorithm>
#include <random>
#include <string>
#include <string_view>
#include <vector>

#include "flashjit/device_memory.hpp"
#include "flashjit/flashjit.hpp"
#include "device_problem.hpp"
#include "every_variant.hpp"
#include "reference.hpp"

using namespace flashjit;
using every_variant::kProblems;
using every_variant::Problem;

namespace flashjit::every_variant {

// The forward's choices, which the backward of its output takes too (every_variant.hpp).
ScoreParams score_params(const Engine& engine, const Variant& variant, bool sinks, int heads_q,
                         std::vector<DeviceBuffer>& buffers) {
  ScoreParams params;
  params.softcap = variant.softcap ? 20.f : 0.f;
  if (variant.window) {  // a band narrower than the problems, on both sides unless causal,
    params.window_left = 48;  // and StreamingLLM's first keys left of it (a partial tile)
    params.window_right = variant.causal ? -1 : 16;
    params.sink_tokens = 5;
  }
  if (sinks) {  // one logit per query head, some above the scores, some below
    constexpr float kSinkLogits[] = {0.5f, -1.f, 2.f, -3.f, 0.f, 1.5f};
    std::vector<float> logits(static_cast<std::size_t>(heads_q));
    for (std::size_t h = 0; h < logits.size(); ++h)
      logits[h] = kSinkLogits[h % std::size(kSinkLogits)];
    params.sink_logits = upload(engine, logits, buffers);
  }
  if (variant.alibi) {  // FlashAttention's slopes for heads_q heads: 2^(-8 (h + 1) / heads_q)
    std::vector<float> slopes(static_cast<std::size_t>(heads_q));
    for (std::size_t h = 0; h < slopes.size(); ++h)
      slopes[h] = std::exp2(-8.f * static_cast<float>(h + 1) / static_cast<float>(heads_q));
    params.alibi_slopes = upload(engine, slopes, buffers);
  }
  return params;
}

}  // namespace flashjit::every_variant

namespace {

// Decode kernels read a KV cache with seqused_k (so every row count is theirs), paged ones through
// a shuffled page table of 64-row pages (decode_tma takes them at every head dim, wgmma in TMA
// runs), wgmma and mma every other problem of 24-row ones too (rows gathered; a page size that is
// not a power of two); the merge kernel merges two random states.
constexpr int kPageSize = 64;
constexpr int kSmallPageSize = 24;

// The cache a variant reads for problem p over k/v: random lengths up to seqlen_k (seqused_k,
// where `with_seqused`), pages for a paged variant (copies of the dense rows, the page table
// shuffled). `buffers` keeps the device arrays alive.
KVCache kv_cache(Engine& engine, const Variant& variant, const Problem& p,
                 const test::DeviceProblem& problem, bool with_seqused, int page_size,
                 std::mt19937& rng, std::vector<DeviceBuffer>& buffers) {
  std::vector<std::int32_t> lengths(static_cast<std::size_t>(p.batch));
  for (auto& length : lengths)
    length = std::uniform_int_distribution<int>(p.seqlen_k / 2, p.seqlen_k)(rng);
  auto upload = [&](const void* data, std::size_t bytes) {
    buffers.emplace_back(engine, bytes);
    buffers.back().upload(data, bytes);
    return static_cast<const std::int32_t*>(buffers.back().data());
  };
  const std::int32_t* seqused = upload(lengths.data(), lengths.size() * 4);
  if (!with_seqused) seqused = nullptr;
  if (!variant.paged) return KVCache::dense(problem.k(), problem.v(), seqused);
  const int pages_per_seq = (p.seqlen_k + page_size - 1) / page_size;
  const int num_pages = p.batch * pages_per_seq;
  std::vector<std::int32_t> table(static_cast<std::size_t>(num_pages));
  for (int i = 0; i < num_pages; ++i) table[static_cast<std::size_t>(i)] = i;
  std::shuffle(table.begin(), table.end(), rng);
  const std::size_t page_bytes =
      static_cast<std::size_t>(page_size) * p.heads_kv * variant.head_dim * 2;
  std::vector<std::uint16_t> pages(num_pages * page_bytes / 2);
  const test::HostTensor& k = problem.host_k();
  std::vector<std::uint16_t> v_pages = pages;
  const test::HostTensor& v = problem.host_v();
  for (int b = 0; b < p.batch; ++b)
    for (int j = 0; j < pages_per_seq * page_size; ++j) {
      const auto page = static_cast<std::size_t>(
          table[static_cast<std::size_t>(b * pages_per_seq + j / page_size)]);
      for (int h = 0; h < p.heads_kv; ++h)
        for (int d = 0; d < variant.head_dim; ++d) {
          const std::size_t at =
              ((page * page_size + j % page_size) * p.heads_kv + h) * variant.head_dim + d;
          const bool in = j < p.seqlen_k;
          pages[at] = in ? k.bits[static_cast<std::size_t>(k.offset(b, j, h, d))] : 0;
          v_pages[at] = in ? v.bits[static_cast<std::size_t>(v.offset(b, j, h, d))] : 0;
        }
    }
  const std::int32_t* page_table = upload(table.data(), table.size() * 4);
  auto* k_data = const_cast<std::int32_t*>(upload(pages.data(), pages.size() * 2));
  auto* v_data = const_cast<std::int32_t*>(upload(v_pages.data(), v_pages.size() * 2));
  return KVCache::paged(
      TensorView::bshd(k_data, variant.dtype, num_pages, page_size, p.heads_kv, variant.head_dim),
      TensorView::bshd(v_data, variant.dtype, num_pages, page_size, p.heads_kv, variant.head_dim),
      page_table, pages_per_seq, seqused);
}

// Runs one variant on one problem; returns an error message, empty on success.
std::string launch(Engine& engine, const Variant& variant, const Problem& p, int page_size,
                   std::mt19937& rng) {
  using test::HostTensor;
  const int d = variant.head_dim;
  HostTensor q = HostTensor::make(variant.dtype, p.batch, p.seqlen_q, p.heads_q, d, p.bhsd);
  HostTensor k = HostTensor::make(variant.dtype, p.batch, p.seqlen_k, p.heads_kv, d, p.bhsd);
  HostTensor v = HostTensor::make(variant.dtype, p.batch, p.seqlen_k, p.heads_kv, d, p.bhsd);
  for (HostTensor* t : {&q, &k, &v}) t->fill_random(rng);
  const test::DeviceProblem problem(engine, std::move(q), std::move(k), std::move(v));
  if (variant.family == "merge") {
    if (p.heads_q != p.heads_kv || p.seqlen_q != p.seqlen_k) return "skip";
    // k and v as two states of q's shape, with random LSEs (some -inf), merged into out.
    std::vector<float> lse(static_cast<std::size_t>(p.batch) * p.heads_q * p.seqlen_q * 2);
    for (std::size_t i = 0; i < lse.size(); ++i)
      lse[i] = i % 7 == 3 ? -INFINITY : std::uniform_real_distribution<float>(-3, 3)(rng);
    DeviceBuffer lse_device(engine, lse.size() * 4);
    lse_device.upload(lse.data(), lse.size() * 4);
    const auto* lse_a = static_cast<const float*>(lse_device.data());
    engine.merge_attention_states(problem.k(), lse_a, problem.v(), lse_a + lse.size() / 2,
                                  problem.out(), problem.lse());
    synchronize(engine);
  } else {
    std::vector<DeviceBuffer> buffers;
    const bool decode = variant.family.starts_with("decode");
    // decode_tma leaves dense problems past 64 query rows per KV head to wgmma, wgmma paged
    // problems up to 64 to the decode kernels.
    const bool decode_rows = p.seqlen_q * (p.heads_q / p.heads_kv) <= 64;
    if (variant.family == "decode_tma" && !variant.paged && !decode_rows) return "skip";
    if (variant.family == "wgmma" && variant.paged && decode_rows) return "skip";
    // Varlen variants (per-sequence lengths) get them from seqused_k.
    const bool seqused = decode || variant.varlen;
    const KVCache kv = seqused || variant.paged
                           ? kv_cache(engine, variant, p, problem, seqused, page_size, rng,
                                      buffers)
                           : KVCache::dense(problem.k(), problem.v());
    ForwardOptions options;
    options.causal = variant.causal;
    options.family = variant.family;
    // Tile tables are keyed on seqlen_k: force the variant's tiles so these small problems reach
    // the shapes chosen for long sequences too.
    options.tiles = TileConfig{variant.tile_m, variant.tile_n, variant.stages};
    options.lse = problem.lse();
    every_variant::score_params(engine, variant, variant.sink, p.heads_q, buffers).apply(options);
    // Decode: split too, so the merge of split partials runs under the sanitizers as well.
    if (decode) options.num_splits = 3;
    const Variant chosen = engine.select_variant(problem.q(), kv, problem.out(), options);
    if (!(chosen == variant)) return fmt::format("the problem selects {}", chosen.name());
    engine.forward(problem.q(), kv, problem.out(), options);
    synchronize(engine);
  }

  for (std::uint16_t bits : problem.output().bits)
    if (!std::isfinite(test::to_float(variant.dtype, bits)))
      return "output not finite or not written";
  return {};
}

}  // namespace

// argv[1] (optional): run only the families whose names start with it (e.g. "decode", "merge",
// "bwd_"; "" for all); a backward helper family (bwd_prep, the *_dq ones...) asked for alone
// brings the dK/dV variants whose backwards run it. argv[2] (optional): "plain" (default) the
// default variants, "softcap" their soft-capped twins (Variant::softcap), "window" their
// sliding-window twins (Variant::window), "sink" their attention-sink twins (Variant::sink),
// "alibi" their ALiBi twins (Variant::alibi), where the family builds them; "both" plain and
// softcap, "all" the five.
int main(int argc, char** argv) {
  try {
    Engine engine(0);
    const std::string_view which = argc > 2 ? argv[2] : "plain";
    if (which != "plain" && which != "softcap" && which != "window" && which != "sink" &&
        which != "alibi" && which != "both" && which != "all") {
      fmt::print(stderr, "usage: {} [FAMILY_PREFIX [plain|softcap|window|sink|alibi|both|all]]\n",
                 argv[0]);
      return 2;
    }
    const bool plain = which == "plain" || which == "both" || which == "all";
    const bool softcap = which == "softcap" || which == "both" || which == "all";
    const bool window = which == "window" || which == "all";
    const bool sink = which == "sink" || which == "all";
    const bool alibi = which == "alibi" || which == "all";
    auto info_of = [](const std::string& family) -> const FamilyInfo& {
      for (const FamilyInfo& info : families())
        if (info.name == family) return info;
      throw Error(ErrorCode::unsupported, "no family " + family);
    };
    // The default variant and the twins of it that `which` asks for, where its family builds them.
    auto twins = [&](const Variant& v) {
      const FamilyInfo& info = info_of(v.family);
      std::vector<Variant> out;
      if (plain) out.push_back(v);
      if (softcap && info.softcap) {
        Variant capped = v;
        capped.softcap = true;
        out.push_back(capped);
      }
      if (window && info.window) {
        Variant windowed = v;
        windowed.window = true;
        out.push_back(windowed);
      }
      if (sink && info.sink) {
        Variant sunk = v;
        sunk.sink = true;
        out.push_back(sunk);
      }
      if (alibi && info.alibi) {
        Variant biased = v;
        biased.alibi = true;
        out.push_back(biased);
      }
      return out;
    };
    const std::string& arch = engine.device().arch;
    auto asked = [&](std::string_view family) { return argc < 2 || family.starts_with(argv[1]); };
    // `every_backward`: the backward's twins whatever the prefix, for the helper families that
    // run only inside the backward of a dK/dV variant the prefix may leave out.
    std::vector<Variant> variants, every_backward;
    std::vector<std::string> with_defaults;
    for (const Variant& v : default_variants(arch)) {
      if (std::find(with_defaults.begin(), with_defaults.end(), v.family) == with_defaults.end())
        with_defaults.push_back(v.family);
      for (const Variant& twin : twins(v)) {
        if (asked(v.family)) variants.push_back(twin);
        if (info_of(v.family).backward) every_backward.push_back(twin);
      }
    }
    // Families with no default variant here are launched by nothing: today the block-mask
    // builders (blockmask, bwd_blockmask), whose variants exist only for a user mask_mod
    // (tests/gpu/test_*block_mask.cpp run them). Named, and counted as skipped.
    std::vector<std::string> skipped;
    for (const FamilyInfo& info : families())
      if (asked(info.name) &&
          std::find(info.archs.begin(), info.archs.end(), arch) != info.archs.end() &&
          std::find(with_defaults.begin(), with_defaults.end(), info.name) == with_defaults.end())
        skipped.push_back(info.name);
    fmt::print("{} ({}): {} default variants\n", engine.device().name, engine.device().arch,
               variants.size());
    if (!skipped.empty())
      fmt::print(
          "skipped, no default variant on {} (block-mask builders are made for a user "
          "mask_mod only): {}\n",
          arch, fmt::join(skipped, ", "));
    // Compiled up front, all cores at once: the sanitizers look at launches, not at NVRTC.
    int failures = 0;
    for (const CompileOutcome& outcome : engine.cache().precompile(variants))
      if (!outcome.ok) {
        fmt::print(stderr, "FAILED to compile {}: {}\n", outcome.variant.name(), outcome.error);
        ++failures;
      }

    std::mt19937 rng(5);
    int launches = 0;
    std::vector<Variant> backward;  // run by Engine::backward, after the forward families
    for (const Variant& variant : variants) {
      if (info_of(variant.family).backward) {
        backward.push_back(variant);
        continue;
      }
      int reached = 0;
      bool small_pages = false;
      for (const Problem& problem : kProblems) {
        std::string error;
        small_pages = (variant.family == "wgmma" || variant.family == "mma") && !small_pages;
        try {
          error = launch(engine, variant, problem, small_pages ? kSmallPageSize : kPageSize, rng);
        } catch (const Error& e) {
          error = e.what();
        }
        if (error == "skip") continue;  // a problem the variant's family does not take
        if (error.empty()) {
          ++reached;
          ++launches;
          continue;
        }
        ++failures;
        fmt::print(stderr, "FAILED {} on {}: {}\n", variant.name(),
                   every_variant::describe(problem), error);
      }
      if (reached == 0) {
        fmt::print(stderr, "no problem ran {}\n", variant.name());
        ++failures;
      }
    }
    const every_variant::Tally tally =
        every_variant::run_backward(engine, backward, every_backward, rng);
    launches += tally.launches;
    failures += tally.failures;
    fmt::print("{} launches of {} variants, {} failures{}\n", launches, variants.size(), failures,
               skipped.empty() ? "" : fmt::format(", {} families skipped", skipped.size()));
    return failures == 0 ? 0 : 1;
  } catch (const std::exception& e) {
    fmt::print(stderr, "FAILED: {}\n", e.what());
    return 1;
  }
}

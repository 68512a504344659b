// flashjit_every_variant: launches every default variant of every family for this GPU on small
// problems with ragged sequence lengths and GQA (plus fully masked rows when causal), each tensor
// in an allocation of exactly its size, so that tools/sanitize.sh can run compute-sanitizer over
// all of the kernel code in one go. Exits non-zero on any error, any output left unwritten or
// non-finite, or a default variant that no problem reached. `flashjit_every_variant decode` runs
// only the families whose names start with "decode"; `flashjit_every_variant "" softcap` the
// soft-capped twins of every attention variant instead (`window`, `sink`, `alibi`: those twins).
#include <fmt/format.h>

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
#include "reference.hpp"

using namespace flashjit;

namespace {

struct Problem {
  int batch, heads_q, heads_kv, seqlen_q, seqlen_k;
  bool bhsd;
};

// Not tile multiples on either side; seqlen_q > seqlen_k in the second gives causal rows that see
// no key; the third is a single query and key. Small, because racecheck slows every launch down a
// hundredfold or more.
constexpr Problem kProblems[] = {
    {1, 4, 2, 70, 133, false},
    {2, 3, 1, 129, 65, true},
    {1, 2, 2, 1, 1, false},
};

// Decode kernels read a KV cache with seqused_k (so every row count is theirs), paged ones through
// a shuffled page table of 64-row pages (decode_tma takes them at every head dim); the merge
// kernel merges two random states.
constexpr int kPageSize = 64;

// The cache a decode variant reads for problem p over k/v: random lengths up to seqlen_k, pages
// for a paged variant (copies of the dense rows, the page table shuffled). `buffers` keeps the
// device arrays alive.
KVCache decode_cache(Engine& engine, const Variant& variant, const Problem& p,
                     const test::DeviceProblem& problem, std::mt19937& rng,
                     std::vector<DeviceBuffer>& buffers) {
  std::vector<std::int32_t> lengths(static_cast<std::size_t>(p.batch));
  for (auto& length : lengths)
    length = std::uniform_int_distribution<int>(p.seqlen_k / 2, p.seqlen_k)(rng);
  auto upload = [&](const void* data, std::size_t bytes) {
    buffers.emplace_back(engine, bytes);
    buffers.back().upload(data, bytes);
    return static_cast<const std::int32_t*>(buffers.back().data());
  };
  const std::int32_t* seqused = upload(lengths.data(), lengths.size() * 4);
  if (!variant.paged) return KVCache::dense(problem.k(), problem.v(), seqused);
  const int pages_per_seq = (p.seqlen_k + kPageSize - 1) / kPageSize;
  const int num_pages = p.batch * pages_per_seq;
  std::vector<std::int32_t> table(static_cast<std::size_t>(num_pages));
  for (int i = 0; i < num_pages; ++i) table[static_cast<std::size_t>(i)] = i;
  std::shuffle(table.begin(), table.end(), rng);
  const std::size_t page_bytes = std::size_t{kPageSize} * p.heads_kv * variant.head_dim * 2;
  std::vector<std::uint16_t> pages(num_pages * page_bytes / 2);
  const test::HostTensor& k = problem.host_k();
  std::vector<std::uint16_t> v_pages = pages;
  const test::HostTensor& v = problem.host_v();
  for (int b = 0; b < p.batch; ++b)
    for (int j = 0; j < pages_per_seq * kPageSize; ++j) {
      const auto page = static_cast<std::size_t>(
          table[static_cast<std::size_t>(b * pages_per_seq + j / kPageSize)]);
      for (int h = 0; h < p.heads_kv; ++h)
        for (int d = 0; d < variant.head_dim; ++d) {
          const std::size_t at =
              ((page * kPageSize + j % kPageSize) * p.heads_kv + h) * variant.head_dim + d;
          const bool in = j < p.seqlen_k;
          pages[at] = in ? k.bits[static_cast<std::size_t>(k.offset(b, j, h, d))] : 0;
          v_pages[at] = in ? v.bits[static_cast<std::size_t>(v.offset(b, j, h, d))] : 0;
        }
    }
  const std::int32_t* page_table = upload(table.data(), table.size() * 4);
  auto* k_data = const_cast<std::int32_t*>(upload(pages.data(), pages.size() * 2));
  auto* v_data = const_cast<std::int32_t*>(upload(v_pages.data(), v_pages.size() * 2));
  return KVCache::paged(
      TensorView::bshd(k_data, variant.dtype, num_pages, kPageSize, p.heads_kv, variant.head_dim),
      TensorView::bshd(v_data, variant.dtype, num_pages, kPageSize, p.heads_kv, variant.head_dim),
      page_table, pages_per_seq, seqused);
}

// Runs one variant on one problem; returns an error message, empty on success.
std::string launch(Engine& engine, const Variant& variant, const Problem& p, std::mt19937& rng) {
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
    // decode_tma leaves dense problems past 64 query rows per KV head to wgmma.
    if (variant.family == "decode_tma" && !variant.paged &&
        p.seqlen_q * (p.heads_q / p.heads_kv) > 64)
      return "skip";
    // Varlen variants (per-sequence lengths) get them from seqused_k.
    const bool seqused = decode || variant.varlen;
    const KVCache kv = seqused ? decode_cache(engine, variant, p, problem, rng, buffers)
                               : KVCache::dense(problem.k(), problem.v());
    ForwardOptions options;
    options.causal = variant.causal;
    options.family = variant.family;
    // Tile tables are keyed on seqlen_k: force the variant's tiles so these small problems reach
    // the shapes chosen for long sequences too.
    options.tiles = TileConfig{variant.tile_m, variant.tile_n, variant.stages};
    options.lse = problem.lse();
    options.softcap = variant.softcap ? 20.f : 0.f;
    if (variant.window) {  // a band narrower than the problems, on both sides unless causal,
      options.window_left = 48;  // and StreamingLLM's first keys left of it (a partial tile)
      options.window_right = variant.causal ? -1 : 16;
      options.sink_tokens = 5;
    }
    if (variant.sink) {  // one logit per query head, some above the scores, some below
      constexpr float kSinkLogits[] = {0.5f, -1.f, 2.f, -3.f, 0.f, 1.5f};
      std::vector<float> sinks(static_cast<std::size_t>(p.heads_q));
      for (std::size_t h = 0; h < sinks.size(); ++h)
        sinks[h] = kSinkLogits[h % std::size(kSinkLogits)];
      buffers.emplace_back(engine, sinks.size() * 4);  // kept alive until after the launch
      buffers.back().upload(sinks.data(), sinks.size() * 4);
      options.sink_logits = static_cast<const float*>(buffers.back().data());
    }
    if (variant.alibi) {  // FlashAttention's slopes for heads_q heads: 2^(-8 (h + 1) / heads_q)
      std::vector<float> slopes(static_cast<std::size_t>(p.heads_q));
      for (std::size_t h = 0; h < slopes.size(); ++h)
        slopes[h] = std::exp2(-8.f * static_cast<float>(h + 1) / static_cast<float>(p.heads_q));
      buffers.emplace_back(engine, slopes.size() * 4);  // kept alive until after the launch
      buffers.back().upload(slopes.data(), slopes.size() * 4);
      options.alibi_slopes = static_cast<const float*>(buffers.back().data());
    }
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

// argv[1] (optional): run only the families whose names start with it (e.g. "decode", "merge";
// "" for all). argv[2] (optional): "plain" (default) the default variants, "softcap" their
// soft-capped twins (Variant::softcap), "window" their sliding-window twins (Variant::window),
// "sink" their attention-sink twins (Variant::sink), "alibi" their ALiBi twins (Variant::alibi),
// where the family builds them; "both" plain and softcap, "all" the five.
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
    std::vector<Variant> variants;
    for (const Variant& v : default_variants(engine.device().arch)) {
      if (argc > 1 && !v.family.starts_with(argv[1])) continue;
      const FamilyInfo& info = info_of(v.family);
      if (plain) variants.push_back(v);
      if (softcap && info.softcap) {
        Variant capped = v;
        capped.softcap = true;
        variants.push_back(capped);
      }
      if (window && info.window) {
        Variant windowed = v;
        windowed.window = true;
        variants.push_back(windowed);
      }
      if (sink && info.sink) {
        Variant sunk = v;
        sunk.sink = true;
        variants.push_back(sunk);
      }
      if (alibi && info.alibi) {
        Variant biased = v;
        biased.alibi = true;
        variants.push_back(biased);
      }
    }
    fmt::print("{} ({}): {} default variants\n", engine.device().name, engine.device().arch,
               variants.size());
    // Compiled up front, all cores at once: the sanitizers look at launches, not at NVRTC.
    int failures = 0;
    for (const CompileOutcome& outcome : engine.cache().precompile(variants))
      if (!outcome.ok) {
        fmt::print(stderr, "FAILED to compile {}: {}\n", outcome.variant.name(), outcome.error);
        ++failures;
      }

    std::mt19937 rng(5);
    int launches = 0;
    for (const Variant& variant : variants) {
      int reached = 0;
      for (const Problem& problem : kProblems) {
        std::string error;
        try {
          error = launch(engine, variant, problem, rng);
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
        fmt::print(stderr, "FAILED {} on b{} hq{} hkv{} sq{} sk{} {}: {}\n", variant.name(),
                   problem.batch, problem.heads_q, problem.heads_kv, problem.seqlen_q,
                   problem.seqlen_k, problem.bhsd ? "bhsd" : "bshd", error);
      }
      if (reached == 0) {
        fmt::print(stderr, "no problem ran {}\n", variant.name());
        ++failures;
      }
    }
    fmt::print("{} launches of {} variants, {} failures\n", launches, variants.size(), failures);
    return failures == 0 ? 0 : 1;
  } catch (const std::exception& e) {
    fmt::print(stderr, "FAILED: {}\n", e.what());
    return 1;
  }
}

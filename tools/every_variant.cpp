// flashjit_every_variant: launches every default variant of every family for this GPU on small
// problems with ragged sequence lengths and GQA (plus fully masked rows when causal), each tensor
// in an allocation of exactly its size, so that tools/sanitize.sh can run compute-sanitizer over
// all of the kernel code in one go. Exits non-zero on any error, any output left unwritten or
// non-finite, or a default variant that no problem reached.
#include <fmt/format.h>

#include <cmath>
#include <cstdint>
#include <random>
#include <string>
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

// Runs one variant on one problem; returns an error message, empty on success.
std::string launch(Engine& engine, const Variant& variant, const Problem& p, std::mt19937& rng) {
  using test::HostTensor;
  const int d = variant.head_dim;
  HostTensor q = HostTensor::make(variant.dtype, p.batch, p.seqlen_q, p.heads_q, d, p.bhsd);
  HostTensor k = HostTensor::make(variant.dtype, p.batch, p.seqlen_k, p.heads_kv, d, p.bhsd);
  HostTensor v = HostTensor::make(variant.dtype, p.batch, p.seqlen_k, p.heads_kv, d, p.bhsd);
  for (HostTensor* t : {&q, &k, &v}) t->fill_random(rng);
  const test::DeviceProblem problem(engine, std::move(q), std::move(k), std::move(v));
  ForwardOptions options;
  options.causal = variant.causal;
  options.family = variant.family;
  // Tile tables are keyed on seqlen_k: force the variant's tiles so these small problems reach
  // the shapes chosen for long sequences too.
  options.tiles = TileConfig{variant.tile_m, variant.tile_n, variant.stages};
  options.lse = problem.lse();
  const Variant chosen =
      engine.select_variant(problem.q(), problem.k(), problem.v(), problem.out(), options);
  if (!(chosen == variant)) return fmt::format("the problem selects {}", chosen.name());
  engine.forward(problem.q(), problem.k(), problem.v(), problem.out(), options);
  synchronize(engine);

  for (std::uint16_t bits : problem.output().bits)
    if (!std::isfinite(test::to_float(variant.dtype, bits)))
      return "output not finite or not written";
  return {};
}

}  // namespace

int main() {
  try {
    Engine engine(0);
    const std::vector<Variant> variants = default_variants(engine.device().arch);
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
      if (reached == 0) fmt::print(stderr, "no problem ran {}\n", variant.name());
    }
    fmt::print("{} launches of {} variants, {} failures\n", launches, variants.size(), failures);
    return failures == 0 ? 0 : 1;
  } catch (const std::exception& e) {
    fmt::print(stderr, "FAILED: {}\n", e.what());
    return 1;
  }
}

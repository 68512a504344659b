// User functions (ForwardOptions::user_functions: score_mod and mask_mod) against the float64
// reference, through the examples of examples/user_functions as a user loads them (document
// masking, a relative-position bias, prefix LM): dense problems on the dispatcher's prefill kernel
// (wgmma on Hopper) and on mma, variable-length batches, decode steps over paged caches; each
// without and with a block mask (Engine::create_block_mask) where the family takes one, whose
// tile counts must match the host mirror's; rows a mask_mod hides wholly (output 0, LSE -inf);
// a score_mod after soft-capping and ALiBi; a block-masked forward in a CUDA graph.
#include <doctest/doctest.h>
#include <fmt/format.h>
#include <fmt/ranges.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <functional>
#include <memory>
#include <numeric>
#include <optional>
#include <random>
#include <string>
#include <utility>
#include <vector>

#include "compare.hpp"
#include "cuda_graph.hpp"
#include "flashjit/device_memory.hpp"
#include "forward_case.hpp"
#include "gpu.hpp"
#include "kv_problem.hpp"
#include "serving_checks.hpp"
#include "user_examples.hpp"
#include "varlen_problem.hpp"

using namespace flashjit;
using namespace flashjit::test;

namespace {

Engine& engine() { return shared_engine(); }

// The examples, made once: a UserFunctions must outlive the forwards that name it.
const UserFunctions& documents() {
  static const UserFunctions functions = document_mask_functions();
  return functions;
}
const UserFunctions& bias() {
  static const UserFunctions functions = relative_position_bias_functions();
  return functions;
}
const UserFunctions& prefix() {
  static const UserFunctions functions = prefix_lm_functions();
  return functions;
}

// This file's own: a nonlinear score_mod (its place after softcap and ALiBi shows in the result,
// as an additive bias's would not after ALiBi), and with it a mask_mod that hides every key from
// the first 130 queries and from every fifth one (rows that see no key, whole query tiles of them)
// and the first 64 keys from the rest.
constexpr const char* kScaling =
    "__device__ float score_mod(float score, int batch, int head, int q_idx, int kv_idx,\n"
    "                           const flashjit::UserArgs& args) {\n"
    "  return 1.5f * score + 0.125f * (kv_idx % 4);\n"
    "}\n";
double scaling(double score, int, int, int, int kv_idx) {
  return 1.5 * score + 0.125 * (kv_idx % 4);
}
constexpr const char* kHiding =
    "__device__ bool mask_mod(int batch, int head, int q_idx, int kv_idx,\n"
    "                         const flashjit::UserArgs& args) {\n"
    "  return q_idx >= 130 && q_idx % 5 != 0 && kv_idx >= 64;\n"
    "}\n";
bool hiding(int, int, int q_idx, int kv_idx) {
  return q_idx >= 130 && q_idx % 5 != 0 && kv_idx >= 64;
}
const UserFunctions& scaled() {
  static const UserFunctions functions(kScaling, "");
  return functions;
}
const UserFunctions& scaled_and_hidden() {
  static const UserFunctions functions(kScaling, kHiding);
  return functions;
}

// User functions with what their args point to on the device, and their host mirrors.
struct UserSetup {
  std::string what;
  const UserFunctions* functions = nullptr;
  std::vector<DeviceBuffer> args;  // args.ptr[i]
  HostScoreMod score_mod;
  HostMaskMod mask_mod;
  BlockMaskOptions mask_options;  // what the mask_mod allows (independent of head, batch)
  bool skips_tiles = false;       // its block mask visits fewer tiles than causal alone

  void apply(ForwardOptions& options) const {
    options.user_functions = functions;
    for (std::size_t i = 0; i < args.size(); ++i) options.user_args[i] = args[i].data();
  }
  // `base` (the case's softcap, ALiBi, ...) with the mirrors.
  ScoreMods mods(ScoreMods base = {}) const {
    base.score_mod = score_mod;
    base.mask_mod = mask_mod;
    return base;
  }
};

UserSetup document_setup(int length, int max_length, std::mt19937& rng) {
  const std::vector<std::int32_t> doc_id = random_documents(length, max_length, rng);
  UserSetup s;
  s.what = fmt::format("document_mask.cu ({} documents of 1 to {})", doc_id.back() + 1, max_length);
  s.functions = &documents();
  s.args.push_back(device_copy(engine(), doc_id));
  s.mask_mod = document_mask(doc_id);
  s.mask_options = {.same_for_all_heads = true, .same_for_all_batches = true};
  // The last query tile (of up to 128 rows) starts in a document after the first key tile (of
  // up to 176 keys), so it skips that tile, causal or not.
  s.skips_tiles = length - max_length > 128 + 176;
  return s;
}

UserSetup bias_setup(int heads_q, std::mt19937& rng) {
  std::vector<float> table(static_cast<std::size_t>(heads_q * (2 * relative_position_range() + 1)));
  std::normal_distribution<float> normal(0.f, 1.f);
  for (float& x : table) x = normal(rng);
  UserSetup s;
  s.what = "relative_position_bias.cu";
  s.functions = &bias();
  s.args.push_back(device_copy(engine(), table));
  s.score_mod = relative_position_bias(table);
  return s;
}

UserSetup prefix_setup(const std::vector<std::int32_t>& lengths) {
  UserSetup s;
  s.what = fmt::format("prefix_lm.cu (prefixes {})", fmt::join(lengths, ", "));
  s.functions = &prefix();
  s.args.push_back(device_copy(engine(), lengths));
  s.mask_mod = prefix_lm(lengths);
  s.mask_options = {.same_for_all_heads = true};
  return s;
}

UserSetup scaling_setup(bool with_hiding) {
  UserSetup s;
  s.what = with_hiding ? "1.5 score + kv_idx % 4 / 8, rows hidden" : "1.5 score + kv_idx % 4 / 8";
  s.functions = with_hiding ? &scaled_and_hidden() : &scaled();
  s.score_mod = scaling;
  if (with_hiding) s.mask_mod = hiding;
  s.mask_options = {.same_for_all_heads = true, .same_for_all_batches = true};
  return s;
}

const FamilyInfo& family_info(const std::string& name) {
  const auto& all = families();
  const auto it =
      std::find_if(all.begin(), all.end(), [&](const FamilyInfo& f) { return f.name == name; });
  REQUIRE(it != all.end());
  return *it;
}

// Compiles `variants` in parallel on the host's cores before the forwards that run them (one by
// one, NVRTC would take most of this file's time).
void precompile(std::vector<Variant> variants) {
  std::vector<Variant> unique;
  for (Variant& v : variants)
    if (std::find(unique.begin(), unique.end(), v) == unique.end()) unique.push_back(std::move(v));
  const auto start = std::chrono::steady_clock::now();
  for (const CompileOutcome& outcome : engine().cache().precompile(unique)) {
    INFO(outcome.variant.name());
    CHECK_MESSAGE(outcome.ok, outcome.error);
  }
  MESSAGE(
      fmt::format("{} variants ready in {:.1f} s", unique.size(),
                  std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count()));
}

// One sequence of a problem (its query and key counts) as a block mask sees it.
struct SequenceLengths {
  int q = 0, k = 0;
};

// What BlockMask::counts() must say for a map over `sequences` (its batches) and `heads`, from
// the host mirror at the variant's tiles: total, the tile pairs holding a score the causal mask
// leaves; visited (full + partial), those holding a score every mask leaves; full, at least the
// whole tiles whose every score is left and at most those plus the ragged ones.
struct ExpectedCounts {
  long long total = 0, visited = 0, full_at_least = 0, full_at_most = 0;
};
ExpectedCounts expected_counts(const Variant& v, const std::vector<SequenceLengths>& sequences,
                               int heads, const HostMaskMod& mask_mod) {
  ExpectedCounts e;
  for (int b = 0; b < static_cast<int>(sequences.size()); ++b) {
    const auto [sq, sk] = sequences[static_cast<std::size_t>(b)];
    for (int h = 0; h < heads; ++h)
      for (int i0 = 0; i0 < sq; i0 += v.tile_m)
        for (int j0 = 0; j0 < sk; j0 += v.tile_n) {
          long long scores = 0, left_by_causal = 0, visible = 0;
          for (int i = i0; i < std::min(sq, i0 + v.tile_m); ++i)
            for (int j = j0; j < std::min(sk, j0 + v.tile_n); ++j) {
              ++scores;
              if (v.causal && j > i + sk - sq) continue;
              ++left_by_causal;
              visible += mask_mod(b, h, i, j);
            }
          const bool whole = i0 + v.tile_m <= sq && j0 + v.tile_n <= sk;
          e.total += left_by_causal > 0;
          e.visited += visible > 0;
          e.full_at_least += whole && visible == scores;
          e.full_at_most += visible == scores;
        }
  }
  return e;
}

// A problem's sizes, for the block mask checks.
struct MaskGeometry {
  std::vector<SequenceLengths> sequences;  // per batch entry
  SequenceLengths longest;                 // the problem's bounds: seqlen_q, the key capacity
  int heads_q = 1;
  bool per_sequence_lengths = false;  // varlen or seqused_k: no map shared by every batch
};

// The block-mask half of a run. Where `variant`'s family takes block masks and the setup has a
// mask_mod: builds one (`build`), checks its variant, sizes and counts against the host mirror,
// and runs `forward_with` on it (which checks the output as the unmasked run was). Elsewhere:
// create_block_mask refuses, naming why. `build` may throw what create_block_mask throws.
void check_block_mask(const Variant& variant, const UserSetup& setup, const MaskGeometry& geometry,
                      const std::function<BlockMask(const BlockMaskOptions&)>& build,
                      const std::function<void(const BlockMask&)>& forward_with) {
  if (!setup.functions->has_mask_mod()) {
    check_refused("create_block_mask without a mask_mod", [&] { build({}); }, {"mask_mod"});
    return;
  }
  if (!family_info(variant.family).block_mask) {
    check_refused("create_block_mask on " + variant.family, [&] { build({}); },
                  {"takes no block mask"});
    return;
  }
  BlockMaskOptions options = setup.mask_options;
  if (geometry.per_sequence_lengths && options.same_for_all_batches) {
    check_refused("same_for_all_batches with per-sequence lengths", [&] { build(options); },
                  {"same_for_all_batches"});
    options.same_for_all_batches = false;
  }
  // Shared where the mask_mod allows it, and one map per head and batch.
  std::vector<BlockMaskOptions> builds = {options};
  if (options.same_for_all_heads || options.same_for_all_batches) builds.push_back({});
  for (const BlockMaskOptions& mask_options : builds) {
    CAPTURE(mask_options.same_for_all_heads);
    CAPTURE(mask_options.same_for_all_batches);
    const BlockMask mask = build(mask_options);
    CHECK(mask.variant() == variant);
    CHECK(mask.query_tiles() == (geometry.longest.q + variant.tile_m - 1) / variant.tile_m);
    CHECK(mask.key_tiles() == (geometry.longest.k + variant.tile_n - 1) / variant.tile_n);
    CHECK(mask.device_bytes() > 0);
    std::vector<SequenceLengths> batches = geometry.sequences;
    if (mask_options.same_for_all_batches) batches.resize(1);
    const ExpectedCounts expected = expected_counts(
        variant, batches, mask_options.same_for_all_heads ? 1 : geometry.heads_q, setup.mask_mod);
    const BlockMask::Counts counts = mask.counts();
    CHECK(counts.total == expected.total);
    CHECK(counts.full + counts.partial == expected.visited);
    CHECK(counts.full >= expected.full_at_least);
    CHECK(counts.full <= expected.full_at_most);
    if (setup.skips_tiles) {  // the case is built so; then the mask must say so
      CHECK(expected.visited < expected.total);
      CHECK(counts.full + counts.partial < counts.total);
    }
    MESSAGE(fmt::format("block mask of {}: {} full + {} partial of {} tiles, {} bytes", setup.what,
                        counts.full, counts.partial, counts.total, mask.device_bytes()));
    forward_with(mask);
  }
}

// One problem with user functions, its inputs and float64 reference made once, run on a kernel
// family (nullopt: the dispatcher's) without and then with a block mask. The subclasses are the
// forward's three forms: dense, varlen, KV cache.
class UserRun {
 public:
  virtual ~UserRun() = default;

  // The options of a run on `kernel`: the case's, the user functions and their args.
  ForwardOptions options(const std::optional<std::string>& kernel) {
    ForwardOptions o = case_options_;
    o.family = kernel;
    if (kernel && kernel->starts_with("decode")) o.num_splits = decode_num_splits_;
    setup_.apply(o);
    return o;
  }
  Variant variant(const std::optional<std::string>& kernel) { return select(options(kernel)); }
  // Poisons the output and LSE, runs, checks against the reference (check_against); returns how
  // many rows see no key.
  virtual int forward(const ForwardOptions& o, CUstream_st* stream = nullptr) = 0;

  void check(const std::optional<std::string>& kernel) {
    const std::string what =
        fmt::format("{} | {} | family {}", what_, setup_.what, kernel.value_or("(dispatcher)"));
    CAPTURE(what);
    try {
      const ForwardOptions o = options(kernel);
      const Variant v = select(o);
      CAPTURE(v.name());
      CHECK(v.user_functions == setup_.functions->hash());
      if (kernel) CHECK(v.family == *kernel);
      const int empty = forward(o);
      MESSAGE(fmt::format("{:<60} {} ({} rows without keys)", v.name(), what, empty));
      check_block_mask(
          v, setup_, geometry_,
          [&](const BlockMaskOptions& mask_options) { return build(o, mask_options); },
          [&](const BlockMask& mask) {
            ForwardOptions masked = o;
            masked.block_mask = &mask;
            CHECK(select(masked) == v);
            CHECK(forward(masked) == empty);
          });
    } catch (const Error& e) {
      FAIL_CHECK(fmt::format("{}: {}", what, e.what()));
    }
  }

 protected:
  explicit UserRun(UserSetup setup) : setup_(std::move(setup)) {}
  virtual Variant select(const ForwardOptions& o) = 0;
  virtual BlockMask build(const ForwardOptions& o, const BlockMaskOptions& mask_options) = 0;

  // Set by the subclass: the case's options (causal, lse, ...), description and geometry.
  UserSetup setup_;
  ForwardOptions case_options_;
  int decode_num_splits_ = 0;  // a forced decode family's (0: its heuristic)
  std::string what_;
  MaskGeometry geometry_;
};

// Compiles every run's variant on each of `kernels` ahead (precompile), then checks each.
template <typename Run>
void run_all(std::vector<std::unique_ptr<Run>>& runs,
             const std::vector<std::optional<std::string>>& kernels) {
  std::vector<Variant> variants;
  for (auto& run : runs)
    for (const auto& kernel : kernels) variants.push_back(run->variant(kernel));
  precompile(variants);
  for (auto& run : runs)
    for (const auto& kernel : kernels) run->check(kernel);
}

// Dense q, k, v (ForwardCase's shape, softcap and ALiBi).
class DenseRun : public UserRun {
 public:
  DenseRun(const ForwardCase& c, UserSetup setup, unsigned seed)
      : UserRun(std::move(setup)), case_(c), problem_(random_problem(engine(), c, seed)) {
    if (!c.alibi_slopes.empty()) slopes_.emplace(device_copy(engine(), c.alibi_slopes));
    const double scale = 1.0 / std::sqrt(static_cast<double>(c.head_dim));
    reference_ = reference_attention(problem_.host_q(), problem_.host_k(), problem_.host_v(), scale,
                                     c.causal, setup_.mods(score_mods(c)));
    geometry_.sequences.assign(static_cast<std::size_t>(c.batch), {c.seqlen_q, c.seqlen_k});
    geometry_.longest = {c.seqlen_q, c.seqlen_k};
    geometry_.heads_q = c.heads_q;
    what_ = c.describe();
    case_options_.causal = c.causal;
    case_options_.lse = problem_.lse();
    case_options_.softcap = c.softcap;
    if (slopes_) case_options_.alibi_slopes = static_cast<const float*>(slopes_->data());
  }

  int forward(const ForwardOptions& o, CUstream_st* stream = nullptr) override {
    problem_.poison();
    engine().forward(problem_.q(), problem_.k(), problem_.v(), problem_.out(), o, stream);
    synchronize(engine());
    return check_against(problem_.output(), problem_.lse_values(), reference_, case_.dtype);
  }
  DeviceProblem& problem() { return problem_; }
  const Reference& reference() const { return reference_; }
  const ForwardCase& shape() const { return case_; }

 private:
  Variant select(const ForwardOptions& o) override {
    return engine().select_variant(problem_.q(), problem_.k(), problem_.v(), problem_.out(), o);
  }
  BlockMask build(const ForwardOptions& o, const BlockMaskOptions& mask_options) override {
    return engine().create_block_mask(problem_.q(), problem_.k(), problem_.v(), problem_.out(), o,
                                      mask_options);
  }

  ForwardCase case_;
  DeviceProblem problem_;
  std::optional<DeviceBuffer> slopes_;
  Reference reference_;
};

// A variable-length batch (VarlenBatch) over a dense packed cache, tight max_seqlen hints.
class VarlenRun : public UserRun {
 public:
  VarlenRun(const VarlenCase& c, const std::function<UserSetup(std::mt19937&)>& make_setup,
            unsigned seed)
      : VarlenRun(c, std::mt19937(seed), make_setup) {}

  int forward(const ForwardOptions& o, CUstream_st* stream = nullptr) override {
    problem_.poison();
    engine().forward(problem_.q(), problem_.kv(), problem_.out(), problem_.varlen(), o, stream);
    synchronize(engine());
    const std::vector<int> empty =
        check_varlen_against(host_, refs_, problem_.output(), problem_.lse_values());
    return std::accumulate(empty.begin(), empty.end(), 0);
  }

 private:
  VarlenRun(const VarlenCase& c, std::mt19937 rng,
            const std::function<UserSetup(std::mt19937&)>& make_setup)
      : UserRun(make_setup(rng)),
        host_(HostVarlen::random(c, rng)),
        refs_(host_.reference({}, setup_.mods())),
        problem_(engine(), host_) {
    for (int b = 0; b < c.batch(); ++b)
      geometry_.sequences.push_back({c.seqlens_q[static_cast<std::size_t>(b)], c.length(b)});
    geometry_.longest = {problem_.varlen().max_seqlen_q, problem_.varlen().max_seqlen_k};
    geometry_.heads_q = c.heads_q;
    geometry_.per_sequence_lengths = true;
    what_ = c.describe();
    case_options_.causal = c.causal;
    case_options_.lse = problem_.lse();
    // Forced decode takes a batch of prefill-sized sequences only split; unsplit, it is mma's or
    // wgmma's (decode_unsupported).
    decode_num_splits_ = 3;
  }
  Variant select(const ForwardOptions& o) override {
    return engine().select_variant(problem_.q(), problem_.kv(), problem_.out(), problem_.varlen(),
                                   o);
  }
  BlockMask build(const ForwardOptions& o, const BlockMaskOptions& mask_options) override {
    return engine().create_block_mask(problem_.q(), problem_.kv(), problem_.out(),
                                      problem_.varlen(), o, mask_options);
  }

  HostVarlen host_;
  std::vector<Reference> refs_;
  VarlenDeviceProblem problem_;
};

// Queries against a KV cache (KvCase: dense or paged, seqused_k).
class KvRun : public UserRun {
 public:
  KvRun(const KvCase& c, const std::function<UserSetup(std::mt19937&)>& make_setup, unsigned seed)
      : KvRun(c, std::mt19937(seed), make_setup) {}

  int forward(const ForwardOptions& o, CUstream_st* stream = nullptr) override {
    problem_.poison();
    engine().forward(problem_.q(), problem_.kv(), problem_.out(), o, stream);
    synchronize(engine());
    return check_against(problem_.output(), problem_.lse_values(), ref_, host_.shape.dtype);
  }

 private:
  KvRun(const KvCase& c, std::mt19937 rng,
        const std::function<UserSetup(std::mt19937&)>& make_setup)
      : UserRun(make_setup(rng)),
        host_(HostKv::random(c, rng)),
        ref_(host_.reference({}, setup_.mods())),
        problem_(engine(), host_) {
    for (int b = 0; b < c.batch; ++b) geometry_.sequences.push_back({c.seqlen_q, host_.length(b)});
    geometry_.longest = {c.seqlen_q, c.capacity};
    geometry_.heads_q = c.heads_q;
    geometry_.per_sequence_lengths = !c.seqused.empty();
    what_ = c.describe();
    case_options_.causal = c.causal;
    case_options_.lse = problem_.lse();
  }
  Variant select(const ForwardOptions& o) override {
    return engine().select_variant(problem_.q(), problem_.kv(), problem_.out(), o);
  }
  BlockMask build(const ForwardOptions& o, const BlockMaskOptions& mask_options) override {
    return engine().create_block_mask(problem_.q(), problem_.kv(), problem_.out(), o, mask_options);
  }

  HostKv host_;
  Reference ref_;
  KvDeviceProblem problem_;
};

// The prefill kernels every dense case runs on: the dispatcher's (wgmma on Hopper) and mma.
const std::vector<std::optional<std::string>> kPrefillKernels = {std::nullopt, "mma"};

}  // namespace

TEST_CASE(
    "user functions: the three examples on dense problems, d64 and d128, causal and not, "
    "GQA, on the dispatcher's prefill kernel and mma, with and without a block mask") {
  std::mt19937 rng(14001);
  std::vector<std::unique_ptr<DenseRun>> runs;
  unsigned seed = 14010;
  for (int d : {64, 128})
    for (bool causal : {true, false}) {
      // Packed documents of up to 150 tokens: most key tiles of a query tile are other
      // documents', so the block mask skips them.
      runs.push_back(std::make_unique<DenseRun>(ForwardCase{2, 4, 2, 640, 640, d, causal},
                                                document_setup(640, 150, rng), seed++));
      // seqlen_q < seqlen_k: distances are kv_idx - q_idx, not bottom-right aligned.
      runs.push_back(std::make_unique<DenseRun>(ForwardCase{2, 6, 2, 300, 500, d, causal},
                                                bias_setup(6, rng), seed++));
    }
  for (int d : {64, 128})  // its own causal part: causal = false
    runs.push_back(std::make_unique<DenseRun>(ForwardCase{3, 4, 1, 500, 500, d, false},
                                              prefix_setup({137, 0, 500}), seed++));
  run_all(runs, kPrefillKernels);
}

TEST_CASE("user functions: rows a mask_mod hides wholly give output 0 and LSE -inf, never NaN") {
  // Non-causal (with causal a row sees itself): rows 0..129 and every fifth see no key, whole
  // query tiles among them, which a block mask leaves with no key tile at all.
  std::vector<std::unique_ptr<DenseRun>> runs;
  runs.push_back(std::make_unique<DenseRun>(ForwardCase{2, 4, 1, 400, 333, 128, false},
                                            scaling_setup(true), 14100));
  runs.push_back(std::make_unique<DenseRun>(ForwardCase{1, 2, 2, 257, 64, 64, false},
                                            scaling_setup(true), 14101));  // every row empty
  run_all(runs, kPrefillKernels);
  for (auto& run : runs) {
    int empty_in_reference = 0;
    for (double lse : run->reference().lse) empty_in_reference += std::isinf(lse);
    const ForwardCase& c = run->shape();
    CHECK(empty_in_reference ==
          c.batch * c.heads_q * (c.seqlen_k > 64 ? 130 + (c.seqlen_q - 130 + 4) / 5 : c.seqlen_q));
  }
}

TEST_CASE("user functions: score_mod takes the score after softcap and ALiBi (the order shows)") {
  std::mt19937 rng(14200);
  auto slopes = [](int heads) {
    std::vector<float> s;
    for (int h = 0; h < heads; ++h)
      s.push_back(std::exp2(-4.f * static_cast<float>(h + 1) / heads));
    return s;
  };
  ForwardCase capped{1, 4, 2, 300, 300, 128, true};
  capped.softcap = 10.f, capped.input_scale = 2.0;  // scores past the cap
  ForwardCase biased{2, 4, 4, 200, 333, 64, false};
  biased.alibi_slopes = slopes(4);
  ForwardCase both = capped;
  both.alibi_slopes = slopes(4);
  std::vector<std::unique_ptr<DenseRun>> runs;
  runs.push_back(std::make_unique<DenseRun>(capped, scaling_setup(false), 14201));
  runs.push_back(std::make_unique<DenseRun>(biased, scaling_setup(false), 14202));
  runs.push_back(std::make_unique<DenseRun>(both, scaling_setup(false), 14203));
  runs.push_back(std::make_unique<DenseRun>(capped, bias_setup(4, rng), 14204));
  run_all(runs, kPrefillKernels);

  // The other order (score_mod first, then the cap and the bias) is far from what ran: the check
  // above can tell them apart.
  DenseRun& run = *runs[2];
  ScoreMods wrong;
  const double cap = both.softcap;
  const std::vector<float> s = both.alibi_slopes;
  wrong.score_mod = [&](double score, int, int head, int q_idx, int kv_idx) {
    // `score` is scale · q·k here (no softcap, no ALiBi in `wrong`): undo nothing, reorder.
    const double modded = scaling(score, 0, head, q_idx, kv_idx);
    return cap * std::tanh(modded / cap) -
           s[static_cast<std::size_t>(head)] *
               std::abs(q_idx + both.seqlen_k - both.seqlen_q - kv_idx);
  };
  const Reference other_order =
      reference_attention(run.problem().host_q(), run.problem().host_k(), run.problem().host_v(),
                          1.0 / std::sqrt(static_cast<double>(both.head_dim)), both.causal, wrong);
  run.forward(run.options(std::nullopt));
  const std::vector<float> lse = run.problem().lse_values();
  CHECK_FALSE(
      describe_failures(compare_forward(run.problem().output(), &lse, other_order), both.dtype)
          .empty());
}

TEST_CASE(
    "user functions: variable-length batches (documents packed in each sequence), on the "
    "dispatcher's kernel and decode, with and without a block mask") {
  struct Case {
    VarlenCase shape;
    std::function<UserSetup(std::mt19937&)> setup;
  };
  auto varlen = [](std::vector<int> q, std::vector<int> k, bool causal) {
    VarlenCase c;
    c.heads_q = 8, c.heads_kv = 2, c.head_dim = 128, c.causal = causal;
    c.seqlens_q = std::move(q), c.seqlens_k = std::move(k);
    return c;
  };
  // Self-attention sequences of 0 to 517 tokens; positions within each sequence index doc_id.
  const std::vector<int> lengths = {300, 1, 0, 517, 64, 129};
  const std::vector<Case> cases = {
      {varlen(lengths, lengths, true),
       [](std::mt19937& rng) { return document_setup(517, 90, rng); }},
      {varlen(lengths, lengths, false),
       [](std::mt19937& rng) { return document_setup(517, 200, rng); }},
      {varlen({1, 200, 65, 0}, {5, 777, 64, 9}, false),
       [](std::mt19937& rng) { return bias_setup(8, rng); }},
      {varlen(lengths, lengths, false),
       [](std::mt19937&) {
         return prefix_setup({50, 1, 7, 600, 0, 129});
       }},
  };
  std::vector<std::unique_ptr<VarlenRun>> runs;
  unsigned seed = 14300;
  for (const Case& c : cases) runs.push_back(std::make_unique<VarlenRun>(c.shape, c.setup, seed++));
  run_all(runs, decode_kernels());
}

TEST_CASE(
    "user functions: decode steps of 1 and 4 queries over a paged cache (decode, "
    "decode_tma), seqused_k, GQA 8:1") {
  struct Case {
    int seqlen_q;
    bool causal;
    std::function<UserSetup(std::mt19937&)> setup;
  };
  constexpr int kCapacity = 2048;
  const std::vector<Case> cases = {
      {1, true, [](std::mt19937& rng) { return document_setup(kCapacity, 300, rng); }},
      {4, true, [](std::mt19937& rng) { return document_setup(kCapacity, 2, rng); }},
      {1, true, [](std::mt19937& rng) { return bias_setup(16, rng); }},
      {4, false, [](std::mt19937& rng) { return bias_setup(16, rng); }},
      {1, false,
       [](std::mt19937&) {
         return prefix_setup({100, 0, 2000});
       }},
      {4, false,
       [](std::mt19937&) {
         return prefix_setup({100, 0, 2000});
       }},
      {4, false, [](std::mt19937&) { return scaling_setup(true); }},  // every row empty
  };
  std::vector<std::unique_ptr<KvRun>> runs;
  unsigned seed = 14400;
  for (const Case& c : cases) {
    KvCase kv;
    kv.batch = 3, kv.heads_q = 16, kv.heads_kv = 2, kv.seqlen_q = c.seqlen_q;
    kv.capacity = kCapacity, kv.head_dim = 128, kv.causal = c.causal;
    kv.page_size = 64, kv.spare_pages = 2, kv.seqused = {kCapacity, 300, 77};
    runs.push_back(std::make_unique<KvRun>(kv, c.setup, seed++));
    for (const auto& kernel : decode_kernels())
      CHECK(runs.back()->variant(kernel).family.starts_with("decode"));
  }
  run_all(runs, decode_kernels());
}

TEST_CASE("user functions: a forward refuses a block mask built for other arguments") {
  std::mt19937 rng(14500);
  DenseRun run(ForwardCase{1, 4, 1, 512, 512, 128, true}, document_setup(512, 100, rng), 14501);
  DeviceProblem& p = run.problem();
  const ForwardOptions o = run.options(std::nullopt);
  const Variant v = run.variant(std::nullopt);
  if (!family_info(v.family).block_mask) {
    MESSAGE(fmt::format("{} takes no block mask on this GPU: nothing to refuse", v.family));
    return;
  }
  const BlockMask mask = engine().create_block_mask(p.q(), p.k(), p.v(), p.out(), o);
  const std::vector<std::string> names = {"block_mask", "block mask"};
  ForwardOptions other = o;
  other.block_mask = &mask;
  other.causal = false;
  check_refused(
      "causal differs", [&] { engine().forward(p.q(), p.k(), p.v(), p.out(), other); }, names);
  other = o;
  other.block_mask = &mask;
  other.user_functions = &prefix();
  check_refused(
      "other user functions", [&] { engine().forward(p.q(), p.k(), p.v(), p.out(), other); },
      names);
  // Fewer queries: the same buffers, a shorter view.
  TensorView q = p.q(), out = p.out();
  q.shape[1] = out.shape[1] = 256;
  other = o;
  other.block_mask = &mask;
  other.lse = nullptr;
  check_refused(
      "seqlen_q differs", [&] { engine().forward(q, p.k(), p.v(), out, other); }, names);
  other = o;
  other.block_mask = &mask;
  other.family = "mma";  // the mask lists tiles of the dispatcher's kernel
  check_refused(
      "another family forced", [&] { engine().forward(p.q(), p.k(), p.v(), p.out(), other); },
      names);
}

TEST_CASE(
    "user functions: a block-masked forward captured in a CUDA graph replays the eager bits") {
  std::mt19937 rng(14600);
  DenseRun run(ForwardCase{2, 4, 2, 640, 640, 128, true}, document_setup(640, 120, rng), 14601);
  DeviceProblem& p = run.problem();
  Stream stream(engine());
  ForwardOptions o = run.options(std::nullopt);
  const Variant v = run.variant(std::nullopt);
  std::optional<BlockMask> mask;
  if (family_info(v.family).block_mask) {
    // Built (and allocated) before the capture; a mask's build is not captured.
    mask.emplace(engine().create_block_mask(
        p.q(), p.k(), p.v(), p.out(), o, {.same_for_all_heads = true, .same_for_all_batches = true},
        stream.get()));
    o.block_mask = &*mask;
  } else {
    MESSAGE(
        fmt::format("{} takes no block mask on this GPU: the graph runs without one", v.family));
  }
  auto forward = [&] { engine().forward(p.q(), p.k(), p.v(), p.out(), o, stream.get()); };
  run.forward(o, stream.get());  // warm: compiled, loaded and planned; checked
  const HostTensor eager_out = p.output();
  const std::vector<float> eager_lse = p.lse_values();
  p.poison();
  const CudaGraph graph(engine().context(), stream.get(), forward);
  stream.synchronize();
  CHECK(all_poison(p.output()));  // capturing runs nothing
  graph.launch(stream.get());
  stream.synchronize();
  CHECK(p.output().bits == eager_out.bits);
  const std::vector<float> replayed_lse = p.lse_values();
  CHECK(std::equal(replayed_lse.begin(), replayed_lse.end(), eager_lse.begin(), eager_lse.end(),
                   [](float a, float b) { return std::memcmp(&a, &b, sizeof a) == 0; }));
  check_against(p.output(), replayed_lse, run.reference(), run.shape().dtype);
}

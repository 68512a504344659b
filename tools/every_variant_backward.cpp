// The backward half of flashjit_every_variant. Each default dK/dV variant (a family that
// BackwardOptions::family takes) runs Engine::backward on every problem with its family and tiles
// forced, after the engine's own forward (the dispatcher's variant) made out and the LSE; in the
// deterministic mode too where that runs another dQ kernel; with learnable sinks and their
// gradient on the first problem. The helper families (the row passes bwd_prep, bwd_convert,
// bwd_sink and the dQ kernels *_dq) run only inside those backwards: the variants the engine
// records while they run say which did.
#include <fmt/format.h>
#include <unistd.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <filesystem>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "every_variant.hpp"
#include "reference.hpp"

namespace flashjit::every_variant {
namespace {

using test::HostTensor;

// Run inside a backward, never chosen by BackwardOptions::family (tests/support/gpu.cpp tells
// them apart the same way; a helper missing here fails as "not a backward dK/dV family").
bool is_helper(const Variant& v) {
  return v.family == "bwd_prep" || v.family == "bwd_convert" || v.family == "bwd_sink" ||
         v.family.ends_with("_dq");
}

// BackwardOptions::deterministic changes the kernels only where it changes the dQ kernel
// (src/api/backward_dispatch.cpp): bwd_mma's dQ atomics and bwd_convert become bwd_mma_dq, while
// bwd_wgmma runs bwd_wgmma_dq in both modes and bwd_wgmma_fused refuses it (its dQ is atomics).
bool deterministic_differs(const Variant& dkdv) {
  return dkdv.family != "bwd_wgmma" && dkdv.family != "bwd_wgmma_fused";
}

// Whether the backward of `dkdv` may run helper `helper`: a row pass runs in every backward of
// its dtype and head dim, a dQ kernel keeps the dK/dV variant's masks and score variants too.
bool may_run(const Variant& dkdv, const Variant& helper) {
  if (dkdv.dtype != helper.dtype || dkdv.head_dim != helper.head_dim) return false;
  return !helper.family.ends_with("_dq") ||
         (dkdv.causal == helper.causal && dkdv.varlen == helper.varlen &&
          dkdv.softcap == helper.softcap && dkdv.window == helper.window &&
          dkdv.alibi == helper.alibi);
}

bool contains(const std::vector<Variant>& variants, const Variant& v) {
  return std::find(variants.begin(), variants.end(), v) != variants.end();
}

// A [b, s, h, d] tensor on the device in an allocation of exactly its size (memcheck sees any
// access past it), with its host copy.
struct DeviceTensor {
  HostTensor host;
  DeviceBuffer device;

  DeviceTensor(const Engine& engine, HostTensor tensor)
      : host(std::move(tensor)), device(engine, host.bytes()) {}
  TensorView view() const {
    TensorView view = host.view;
    view.data = device.data();
    return view;
  }
  // Rows [first, first + count) of a packed [1, total, h, d] tensor, as a [1, count, h, d] view.
  TensorView rows(std::int64_t first, std::int64_t count) const {
    TensorView view = this->view();
    view.data = static_cast<std::uint16_t*>(device.data()) + first * view.stride[1];
    view.shape[1] = count;
    return view;
  }
  void poison() { device.fill_bytes(0xff); }  // NaN in bf16 and fp16
  // Whether every element is finite now (a copy to the host; synchronize first).
  bool finite() {
    device.download(host.bits.data(), host.bytes());
    return std::all_of(host.bits.begin(), host.bits.end(), [&](std::uint16_t bits) {
      return std::isfinite(test::to_float(host.view.dtype, bits));
    });
  }
};

// The packed sequences of a varlen variant's backward (FlashAttention's cu_seqlens), made from a
// problem: batch + 1 of them, the first of the problem's own lengths (its causal rows that see no
// key stay; and its lengths are the longest), the others random: 0 to seqlen_q queries (a
// sequence whose keys no row sees), 1 to seqlen_k keys.
struct Sequences {
  std::vector<std::int32_t> cu_q{0}, cu_k{0};

  Sequences(const Problem& p, std::mt19937& rng) {
    for (int s = 0; s <= p.batch; ++s) {
      const int queries =
          s == 0 ? p.seqlen_q : std::uniform_int_distribution<int>(0, p.seqlen_q)(rng);
      const int keys = s == 0 ? p.seqlen_k : std::uniform_int_distribution<int>(1, p.seqlen_k)(rng);
      cu_q.push_back(cu_q.back() + queries);
      cu_k.push_back(cu_k.back() + keys);
    }
  }
  int count() const { return static_cast<int>(cu_q.size()) - 1; }
  int queries(int s) const { return cu_q[s + 1] - cu_q[s]; }
  int keys(int s) const { return cu_k[s + 1] - cu_k[s]; }
};

// A varlen batch's out and LSE ([heads_q, total_q]) from a dense forward per sequence, each its
// own problem as in the varlen forward, which has no family at some head dims the backward has.
void forward_per_sequence(Engine& engine, const Sequences& seqs, const DeviceTensor& q,
                          const DeviceTensor& k, const DeviceTensor& v, const DeviceTensor& out,
                          ForwardOptions options, DeviceBuffer& lse, int heads_q) {
  const auto total_q = static_cast<std::size_t>(seqs.cu_q.back());
  std::vector<float> packed(static_cast<std::size_t>(heads_q) * total_q);
  for (int s = 0; s < seqs.count(); ++s) {
    const int rows = seqs.queries(s);
    if (rows == 0) continue;  // no query: nothing to compute
    std::vector<float> own(static_cast<std::size_t>(heads_q) * rows);  // [1, heads_q, rows]
    DeviceBuffer own_device(engine, own.size() * sizeof(float));
    options.lse = static_cast<float*>(own_device.data());
    engine.forward(q.rows(seqs.cu_q[s], rows), k.rows(seqs.cu_k[s], seqs.keys(s)),
                   v.rows(seqs.cu_k[s], seqs.keys(s)), out.rows(seqs.cu_q[s], rows), options);
    synchronize(engine);
    own_device.download(own.data(), own.size() * sizeof(float));
    for (int h = 0; h < heads_q; ++h)
      std::copy_n(own.begin() + static_cast<std::ptrdiff_t>(h) * rows, rows,
                  packed.begin() + static_cast<std::ptrdiff_t>(h * total_q + seqs.cu_q[s]));
  }
  lse.upload(packed.data(), packed.size() * sizeof(float));
}

// One dK/dV variant on one problem: the forward, then a backward in each mode that runs other
// kernels, its gradients poisoned before and checked finite after. `sinks`: learnable sinks and
// their gradient (bwd_sink). Returns an error message, empty on success; adds the backwards that
// passed to `launches`.
std::string launch_backward(Engine& engine, const Variant& variant, const Problem& p, bool sinks,
                            std::mt19937& rng, int& launches) {
  // A varlen variant's sequences are packed ([1, total, heads, head_dim], BSHD).
  const std::optional<Sequences> seqs =
      variant.varlen ? std::optional<Sequences>(std::in_place, p, rng) : std::nullopt;
  const int batch = seqs ? 1 : p.batch;
  const int rows_q = seqs ? seqs->cu_q.back() : p.seqlen_q;
  const int rows_k = seqs ? seqs->cu_k.back() : p.seqlen_k;
  auto tensor = [&](int rows, int heads, bool random) {
    DeviceTensor t(engine, HostTensor::make(variant.dtype, batch, rows, heads, variant.head_dim,
                                            !seqs && p.bhsd));
    if (random) {
      t.host.fill_random(rng);
      t.device.upload(t.host.bits.data(), t.host.bytes());
    }
    return t;
  };
  const DeviceTensor q = tensor(rows_q, p.heads_q, true), k = tensor(rows_k, p.heads_kv, true),
                     v = tensor(rows_k, p.heads_kv, true), dout = tensor(rows_q, p.heads_q, true);
  DeviceTensor out = tensor(rows_q, p.heads_q, false), dq = tensor(rows_q, p.heads_q, false),
               dk = tensor(rows_k, p.heads_kv, false), dv = tensor(rows_k, p.heads_kv, false);
  // [batch, heads_q, seqlen_q], or [heads_q, total_q] for packed sequences.
  DeviceBuffer lse(engine, sizeof(float) * static_cast<std::size_t>(batch) * p.heads_q * rows_q);
  auto* lse_data = static_cast<float*>(lse.data());
  std::vector<DeviceBuffer> buffers;  // what the options and the varlen batch point at
  const ScoreParams score = score_params(engine, variant, sinks, p.heads_q, buffers);

  ForwardOptions forward;
  forward.causal = variant.causal;
  score.apply(forward);
  out.poison();
  if (seqs) {
    forward_per_sequence(engine, *seqs, q, k, v, out, forward, lse, p.heads_q);
  } else {
    forward.lse = lse_data;
    engine.forward(q.view(), k.view(), v.view(), out.view(), forward);
  }
  synchronize(engine);
  if (!out.finite()) return "the forward's output not finite or not written";

  BackwardOptions options;
  options.causal = variant.causal;
  score.apply(options);
  options.family = variant.family;
  // As the forward's: the variant's tiles, whatever the problem's length.
  options.tiles = TileConfig{variant.tile_m, variant.tile_n, variant.stages};
  std::optional<DeviceBuffer> dsink;
  if (sinks) {
    dsink.emplace(engine, sizeof(float) * p.heads_q);
    options.d_sink_logits = static_cast<float*>(dsink->data());
  }
  VarlenBatch varlen;
  if (seqs)
    varlen = {upload(engine, seqs->cu_q, buffers), upload(engine, seqs->cu_k, buffers),
              seqs->count(), p.seqlen_q, p.seqlen_k};
  for (const bool deterministic : {false, true}) {
    if (deterministic && !deterministic_differs(variant)) continue;
    options.deterministic = deterministic;
    const std::string_view mode = deterministic ? " (deterministic)" : "";
    const Variant chosen =
        seqs ? engine.select_backward_variant(q.view(), k.view(), v.view(), varlen, options)
             : engine.select_backward_variant(q.view(), k.view(), v.view(), options);
    if (!(chosen == variant)) return fmt::format("the problem selects {}{}", chosen.name(), mode);
    for (DeviceTensor* gradient : {&dq, &dk, &dv}) gradient->poison();
    if (dsink) dsink->fill_bytes(0xff);
    if (seqs)
      engine.backward(q.view(), k.view(), v.view(), out.view(), dout.view(), lse_data, dq.view(),
                      dk.view(), dv.view(), varlen, options);
    else
      engine.backward(q.view(), k.view(), v.view(), out.view(), dout.view(), lse_data, dq.view(),
                      dk.view(), dv.view(), options);
    synchronize(engine);
    for (auto [name, gradient] : {std::pair{"dq", &dq}, std::pair{"dk", &dk}, std::pair{"dv", &dv}})
      if (!gradient->finite()) return fmt::format("{} not finite or not written{}", name, mode);
    if (dsink) {
      std::vector<float> values(static_cast<std::size_t>(p.heads_q));
      dsink->download(values.data(), values.size() * sizeof(float));
      if (!std::all_of(values.begin(), values.end(), [](float x) { return std::isfinite(x); }))
        return fmt::format("d_sink_logits not finite or not written{}", mode);
    }
    ++launches;
  }
  return {};
}

// Each dK/dV variant on every problem, learnable sinks on the first (where every row of the dense
// problem sees keys anyway, so the others keep their rows with LSE -inf).
void run(Engine& engine, const std::vector<Variant>& dkdv, std::mt19937& rng, Tally& tally) {
  for (const Variant& variant : dkdv) {
    int reached = 0;
    for (const Problem& problem : kProblems) {
      const bool sinks = &problem == &kProblems[0];
      std::string error;
      try {
        error = launch_backward(engine, variant, problem, sinks, rng, tally.launches);
      } catch (const Error& e) {
        error = e.what();
      }
      if (error.empty()) {
        ++reached;
        continue;
      }
      ++tally.failures;
      fmt::print(stderr, "FAILED {} on {}{}: {}\n", variant.name(), describe(problem),
                 sinks ? " with sinks" : "", error);
    }
    if (reached == 0) {
      fmt::print(stderr, "no problem ran {}\n", variant.name());
      ++tally.failures;
    }
  }
}

// The variants the engine runs for the first time while this lives, in a manifest of a temp file
// (Engine::record_variants; the engine had run no backward before).
class Recording {
 public:
  explicit Recording(Engine& engine)
      : engine_(engine),
        file_(std::filesystem::temp_directory_path() /
              fmt::format("flashjit_every_variant.{}.manifest", ::getpid())) {
    std::filesystem::remove(file_);  // a dead process's of the same id
    engine_.record_variants(file_);
  }
  ~Recording() {
    engine_.record_variants({});
    std::error_code ignored;
    std::filesystem::remove(file_, ignored);
  }
  Recording(const Recording&) = delete;
  Recording& operator=(const Recording&) = delete;

  std::vector<Variant> variants() const {
    return std::filesystem::exists(file_) ? read_variant_manifest(file_) : std::vector<Variant>{};
  }

 private:
  Engine& engine_;
  std::filesystem::path file_;
};

}  // namespace

Tally run_backward(Engine& engine, const std::vector<Variant>& asked,
                   const std::vector<Variant>& every, std::mt19937& rng) {
  Tally tally;
  if (asked.empty()) return tally;
  std::vector<Variant> dkdv, helpers;
  for (const Variant& v : asked) (is_helper(v) ? helpers : dkdv).push_back(v);
  fmt::print("backward: {} dK/dV variants, {} helper variants that run inside their backwards\n",
             dkdv.size(), helpers.size());
  const Recording recording(engine);
  auto not_run = [&] {
    const std::vector<Variant> ran = recording.variants();
    std::vector<Variant> missing;
    for (const Variant& helper : helpers)
      if (!contains(ran, helper)) missing.push_back(helper);
    return missing;
  };
  run(engine, dkdv, rng, tally);
  // Helpers that the asked dK/dV variants did not run (a prefix naming helper families only): the
  // other dK/dV variants, each while a helper it may run is still missing (compiled on the way).
  std::vector<Variant> missing = not_run();
  int carriers = 0;
  for (const Variant& v : every) {
    if (is_helper(v) || contains(dkdv, v) ||
        std::none_of(missing.begin(), missing.end(),
                     [&](const Variant& helper) { return may_run(v, helper); }))
      continue;
    run(engine, {v}, rng, tally);
    ++carriers;
    missing = not_run();
  }
  if (carriers > 0)
    fmt::print("backward: {} more dK/dV variants ran for the helper variants\n", carriers);
  for (const Variant& helper : missing) {
    fmt::print(stderr, "no problem ran {}\n", helper.name());
    ++tally.failures;
  }
  return tally;
}

}  // namespace flashjit::every_variant

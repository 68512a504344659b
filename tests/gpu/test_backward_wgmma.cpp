// The Hopper backward against bwd_mma, the mma.sync backward checked against float64: the same
// gradients up to 16-bit rounding over head dims, masks, GQA and uneven lengths (causal rows that
// see no key included), every row written. bwd_wgmma_fused (the default up to head dim 128: dQ
// added up in the same kernel) and bwd_wgmma + bwd_wgmma_dq (d256, the deterministic mode, and
// forced: the same bits on every run, no atomics anywhere).
#include <doctest/doctest.h>
#include <fmt/format.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <random>
#include <string>
#include <vector>

#include "flashjit/device_memory.hpp"
#include "gpu.hpp"
#include "reference.hpp"

using namespace flashjit;
using namespace flashjit::test;

namespace {

bool on_hopper() { return shared_engine().device().arch == "sm_90a"; }

struct Case {
  DType dtype;
  int head_dim, seqlen_q, seqlen_k, heads_q, heads_kv;
  bool causal;

  std::string describe() const {
    return fmt::format("{} d{} q{} k{} h{}/{}{}", to_string(dtype), head_dim, seqlen_q, seqlen_k,
                       heads_q, heads_kv, causal ? " causal" : "");
  }
};

// A device tensor [2, s, h, d] with its host twin: random contents, or a NaN pattern for outputs
// (so a row left unwritten shows).
struct DeviceTensor {
  HostTensor host;
  DeviceBuffer device;

  DeviceTensor(const Case& c, int s, int h, std::mt19937* rng)
      : host(HostTensor::make(c.dtype, 2, s, h, c.head_dim, false)),
        device(shared_engine(), host.bytes()) {
    if (rng != nullptr)
      host.fill_random(*rng);
    else
      host.fill(c.dtype == DType::bf16 ? 0x7fc0 : 0x7e00);
    device.upload(host.bits.data(), host.bytes());
  }
  TensorView view() const {
    TensorView v = host.view;
    v.data = device.data();
    return v;
  }
  std::vector<std::uint16_t> bits() const {
    std::vector<std::uint16_t> out(host.bits.size());
    device.download(out.data(), host.bytes());
    return out;
  }
};

struct Gradients {
  std::vector<std::uint16_t> dq, dk, dv;
};

struct Inputs {
  Case c;
  DeviceTensor q, k, v, dout, out;
  DeviceBuffer lse;

  Inputs(const Case& c_, std::mt19937& rng)
      : c(c_),
        q(c, c.seqlen_q, c.heads_q, &rng),
        k(c, c.seqlen_k, c.heads_kv, &rng),
        v(c, c.seqlen_k, c.heads_kv, &rng),
        dout(c, c.seqlen_q, c.heads_q, &rng),
        out(c, c.seqlen_q, c.heads_q, nullptr),
        lse(shared_engine(), sizeof(float) * 2 * c.heads_q * c.seqlen_q) {
    ForwardOptions forward;
    forward.causal = c.causal;
    forward.lse = static_cast<float*>(lse.data());
    shared_engine().forward(q.view(), k.view(), v.view(), out.view(), forward);
  }

  BackwardOptions options(const char* family, bool deterministic) const {
    BackwardOptions o;
    o.causal = c.causal;
    if (family != nullptr) o.family = family;
    o.deterministic = deterministic;
    return o;
  }

  Gradients backward(const BackwardOptions& options) const {
    const DeviceTensor dq(c, c.seqlen_q, c.heads_q, nullptr), dk(c, c.seqlen_k, c.heads_kv, nullptr),
        dv(c, c.seqlen_k, c.heads_kv, nullptr);
    shared_engine().backward(q.view(), k.view(), v.view(), out.view(), dout.view(),
                             static_cast<const float*>(lse.data()), dq.view(), dk.view(),
                             dv.view(), options);
    synchronize(shared_engine());
    return {dq.bits(), dk.bits(), dv.bits()};
  }
};

// Max |a - b| relative to max |b|, and whether every value of `a` is finite (written).
struct Difference {
  double relative_max = 0;
  bool all_finite = true;
};
Difference compare(DType dtype, const std::vector<std::uint16_t>& a,
                   const std::vector<std::uint16_t>& b) {
  double largest = 1e-6, worst = 0;
  bool finite = true;
  for (std::size_t i = 0; i < a.size(); ++i) {
    const double x = to_float(dtype, a[i]), y = to_float(dtype, b[i]);
    finite = finite && std::isfinite(x);
    largest = std::max(largest, std::fabs(y));
    worst = std::max(worst, std::fabs(x - y));
  }
  return {worst / largest, finite};
}

}  // namespace

TEST_CASE("bwd_wgmma(_fused) compute bwd_mma's gradients; bwd_wgmma the same bits on every run") {
  if (!on_hopper()) {
    MESSAGE("not an sm_90a GPU: bwd_wgmma tests not run");
    return;
  }
  const Case cases[] = {
      {DType::bf16, 64, 300, 300, 4, 4, false},
      {DType::bf16, 64, 300, 300, 4, 4, true},
      {DType::fp16, 64, 1000, 777, 4, 1, true},   // MQA; rows past the keys' diagonal
      {DType::bf16, 128, 150, 190, 4, 2, true},   // GQA, seqlen_q < seqlen_k
      {DType::fp16, 128, 257, 129, 8, 2, true},   // seqlen_q > seqlen_k: rows that see no key
      {DType::bf16, 128, 1024, 1024, 2, 2, false},
      {DType::bf16, 128, 1, 77, 2, 1, false},     // one query row
      {DType::bf16, 256, 200, 333, 2, 1, false},
      {DType::fp16, 256, 333, 200, 2, 2, true},
      {DType::bf16, 256, 512, 512, 4, 2, true},
      // 8 key tiles x 24 pairs: the persistent causal grid (BwdKeyTileWalk) takes two rounds,
      // the second part empty
      {DType::bf16, 128, 1000, 1000, 36, 12, true},
  };
  std::mt19937 rng(7);
  for (const Case& c : cases) {
    CAPTURE(c.describe());
    const Inputs in(c, rng);
    const BackwardOptions fast = in.options(nullptr, false);
    const bool fuses = c.head_dim <= 128;
    CHECK(shared_engine()
              .select_backward_variant(in.q.view(), in.k.view(), in.v.view(), fast)
              .family == (fuses ? "bwd_wgmma_fused" : "bwd_wgmma"));
    const Gradients fastest = in.backward(fast);
    const BackwardOptions unfused = in.options("bwd_wgmma", false);
    const Gradients first = in.backward(unfused);
    const Gradients again = in.backward(unfused);
    CHECK(first.dq == again.dq);  // no atomics: the same bits in the default mode
    CHECK(first.dk == again.dk);
    CHECK(first.dv == again.dv);
    const Gradients exact = in.backward(in.options(nullptr, true));
    CHECK(exact.dq == first.dq);  // and the deterministic mode runs the same kernels
    // The fused kernel's dK and dV are the same GEMMs in the same order: the same bits.
    CHECK(fastest.dk == first.dk);
    CHECK(fastest.dv == first.dv);
    const Gradients mma = in.backward(in.options("bwd_mma", true));
    const double tolerance = c.dtype == DType::bf16 ? 2e-2 : 5e-3;
    const char* names[] = {"dq", "dk", "dv", "dq fused"};
    const std::vector<std::uint16_t>* ours[] = {&first.dq, &first.dk, &first.dv, &fastest.dq};
    const std::vector<std::uint16_t>* theirs[] = {&mma.dq, &mma.dk, &mma.dv, &mma.dq};
    for (int g = 0; g < 4; ++g) {
      const Difference d = compare(c.dtype, *ours[g], *theirs[g]);
      INFO(names[g], ": max |wgmma - mma| / max |mma| = ", d.relative_max);
      CHECK(d.all_finite);
      CHECK(d.relative_max <= tolerance);
      MESSAGE(fmt::format("{:<32} {} {:.2e}", c.describe(), names[g], d.relative_max));
    }
  }
}

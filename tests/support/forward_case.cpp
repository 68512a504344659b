#include "forward_case.hpp"

#include <fmt/format.h>

#include <cmath>
#include <random>

#include "flashjit/device_memory.hpp"
#include "reference.hpp"

namespace flashjit::test {

std::string ForwardCase::describe() const {
  return fmt::format("b{} hq{} hkv{} sq{} sk{} d{} {} {} {}", batch, heads_q, heads_kv, seqlen_q,
                     seqlen_k, head_dim, causal ? "causal" : "full", to_string(dtype),
                     bhsd ? "bhsd" : "bshd");
}

double max_abs_tolerance(DType dtype) { return dtype == DType::bf16 ? 2.5e-2 : 5e-3; }
double relative_tolerance(DType dtype) { return dtype == DType::bf16 ? 1.2e-2 : 3e-3; }

ForwardCheck run_forward_case(Engine& engine, const ForwardCase& c, std::optional<Family> family,
                              unsigned seed) {
  std::mt19937 rng(seed);
  auto q = HostTensor::make(c.dtype, c.batch, c.seqlen_q, c.heads_q, c.head_dim, c.bhsd);
  auto k = HostTensor::make(c.dtype, c.batch, c.seqlen_k, c.heads_kv, c.head_dim, c.bhsd);
  auto v = HostTensor::make(c.dtype, c.batch, c.seqlen_k, c.heads_kv, c.head_dim, c.bhsd);
  q.fill_random(rng);
  k.fill_random(rng);
  v.fill_random(rng);

  auto bytes = [](const HostTensor& t) { return t.bits.size() * 2; };
  DeviceBuffer dq(engine, bytes(q)), dk(engine, bytes(k)), dv(engine, bytes(v)),
      dout(engine, bytes(q));
  DeviceBuffer dlse(engine, static_cast<size_t>(c.batch) * c.heads_q * c.seqlen_q * 4);
  dq.upload(q.bits.data(), bytes(q));
  dk.upload(k.bits.data(), bytes(k));
  dv.upload(v.bits.data(), bytes(v));
  dout.fill_bytes(0xff);  // NaN in bf16 and fp16: any element left unwritten fails the check
  dlse.fill_bytes(0xff);

  auto with_data = [](TensorView view, const DeviceBuffer& buffer) {
    view.data = buffer.data();
    return view;
  };
  ForwardOptions options;
  options.causal = c.causal;
  options.family = family;
  if (c.with_lse) options.lse = static_cast<float*>(dlse.data());
  const TensorView out_view = with_data(q.view, dout);
  ForwardCheck check;
  check.variant = engine.select_variant(with_data(q.view, dq), with_data(k.view, dk),
                                        with_data(v.view, dv), out_view, options)
                      .name();
  engine.forward(with_data(q.view, dq), with_data(k.view, dk), with_data(v.view, dv), out_view,
                 options);
  synchronize(engine);

  HostTensor out = HostTensor::make(c.dtype, c.batch, c.seqlen_q, c.heads_q, c.head_dim, c.bhsd);
  dout.download(out.bits.data(), bytes(out));
  const double scale = 1.0 / std::sqrt(static_cast<double>(c.head_dim));
  const Reference ref = reference_attention(q, k, v, scale, c.causal);

  double err2 = 0, ref2 = 0;
  for (int b = 0; b < c.batch; ++b)
    for (int s = 0; s < c.seqlen_q; ++s)
      for (int h = 0; h < c.heads_q; ++h)
        for (int d = 0; d < c.head_dim; ++d) {
          const double got = out.at(b, s, h, d);
          const double want =
              ref.out[static_cast<size_t>(((static_cast<long>(b) * c.seqlen_q + s) * c.heads_q + h) *
                                              c.head_dim + d)];
          if (!std::isfinite(got)) {
            check.all_written = false;
            continue;
          }
          check.max_abs_error = std::max(check.max_abs_error, std::abs(got - want));
          err2 += (got - want) * (got - want);
          ref2 += want * want;
        }
  check.relative_l2_error = ref2 > 0 ? std::sqrt(err2 / ref2) : std::sqrt(err2);
  if (c.with_lse) {
    std::vector<float> lse(ref.lse.size());
    dlse.download(lse.data(), lse.size() * sizeof(float));
    for (size_t i = 0; i < ref.lse.size(); ++i) {
      const double want = ref.lse[i];
      const double got = lse[i];
      if (std::isinf(want)) {
        if (!(std::isinf(got) && got < 0)) check.max_lse_error = INFINITY;
      } else if (!std::isfinite(got)) {
        check.max_lse_error = INFINITY;
      } else {
        check.max_lse_error = std::max(check.max_lse_error, std::abs(got - want));
      }
    }
  }
  return check;
}

}  // namespace flashjit::test

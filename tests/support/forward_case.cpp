#include "forward_case.hpp"

#include <doctest/doctest.h>
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

void check_within_bounds(const ForwardErrors& errors, DType dtype) {
  const std::string failures = describe_failures(errors, dtype);
  CHECK_MESSAGE(failures.empty(), failures);
}

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

  std::vector<float> lse(ref.lse.size());
  if (c.with_lse) dlse.download(lse.data(), lse.size() * sizeof(float));
  static_cast<ForwardErrors&>(check) = compare_forward(out, c.with_lse ? &lse : nullptr, ref);
  return check;
}

}  // namespace flashjit::test

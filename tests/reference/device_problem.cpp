#include "device_problem.hpp"

namespace flashjit::test {
namespace {

DeviceBuffer uploaded(const Engine& engine, const HostTensor& t) {
  DeviceBuffer buffer(engine, t.bytes());
  buffer.upload(t.bits.data(), t.bytes());
  return buffer;
}

std::size_t lse_count(const HostTensor& q) {
  return static_cast<std::size_t>(q.view.shape[0] * q.view.shape[2] * q.view.shape[1]);
}

}  // namespace

DeviceProblem::DeviceProblem(const Engine& engine, HostTensor q, HostTensor k, HostTensor v,
                             unsigned char poison_byte)
    : q_(std::move(q)),
      k_(std::move(k)),
      v_(std::move(v)),
      q_device_(uploaded(engine, q_)),
      k_device_(uploaded(engine, k_)),
      v_device_(uploaded(engine, v_)),
      out_device_(engine, q_.bytes()),
      lse_device_(engine, lse_count(q_) * sizeof(float)) {
  poison(poison_byte);
}

TensorView DeviceProblem::on_device(const HostTensor& host, const DeviceBuffer& buffer) {
  TensorView view = host.view;
  view.data = buffer.data();
  return view;
}

void DeviceProblem::poison(unsigned char value) {
  out_device_.fill_bytes(value);
  lse_device_.fill_bytes(value);
}

HostTensor DeviceProblem::output() const {
  HostTensor out = q_;
  out_device_.download(out.bits.data(), out.bytes());
  return out;
}

std::vector<float> DeviceProblem::lse_values() const {
  std::vector<float> lse(lse_count(q_));
  lse_device_.download(lse.data(), lse.size() * sizeof(float));
  return lse;
}

}  // namespace flashjit::test

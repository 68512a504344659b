// One forward problem on a GPU: host q/k/v (kept for the reference) uploaded once, and an output
// and LSE buffer filled with a poison byte before the run, so any element a kernel skips shows.
#pragma once

#include <vector>

#include "flashjit/device_memory.hpp"
#include "flashjit/flashjit.hpp"
#include "reference.hpp"

namespace flashjit::test {

class DeviceProblem {
 public:
  // The output takes q's view (shape and strides); 0xff bytes are NaN in bf16, fp16 and fp32.
  DeviceProblem(const Engine& engine, HostTensor q, HostTensor k, HostTensor v,
                unsigned char poison = 0xff);

  TensorView q() const { return on_device(q_, q_device_); }
  TensorView k() const { return on_device(k_, k_device_); }
  TensorView v() const { return on_device(v_, v_device_); }
  TensorView out() const { return on_device(q_, out_device_); }
  float* lse() const { return static_cast<float*>(lse_device_.data()); }  // [b, hq, sq]

  // Refills the output and LSE with the poison byte.
  void poison(unsigned char value = 0xff);
  // What the GPU wrote (call after synchronizing): the output in q's view, and the LSE.
  HostTensor output() const;
  std::vector<float> lse_values() const;

  const HostTensor& host_q() const { return q_; }
  const HostTensor& host_k() const { return k_; }
  const HostTensor& host_v() const { return v_; }

 private:
  static TensorView on_device(const HostTensor& host, const DeviceBuffer& buffer);

  HostTensor q_, k_, v_;
  DeviceBuffer q_device_, k_device_, v_device_, out_device_, lse_device_;
};

}  // namespace flashjit::test

// A forward's output and LSE on the device, refilled with a poison byte (0xff: NaN in bf16, fp16
// and fp32) before each run, so any element a kernel skips shows; shared by the KV and varlen
// test problems.
#pragma once

#include <cstddef>
#include <vector>

#include "flashjit/device_memory.hpp"
#include "flashjit/flashjit.hpp"
#include "reference.hpp"

namespace flashjit::test {

class PoisonedOutput {
 public:
  // `view`: the output's layout (data unset) over `host_bits` 16-bit elements; lse_count floats.
  PoisonedOutput(const Engine& engine, const TensorView& view, std::size_t host_bits,
                 std::size_t lse_count);

  TensorView out() const;
  float* lse() const { return static_cast<float*>(lse_.data()); }
  void poison(unsigned char value = 0xff);
  // What the GPU wrote (call after synchronizing): the output in its view, and the LSE.
  HostTensor output() const;
  std::vector<float> lse_values() const;

 private:
  TensorView view_;
  std::size_t lse_count_;
  DeviceBuffer out_, lse_;
};

}  // namespace flashjit::test

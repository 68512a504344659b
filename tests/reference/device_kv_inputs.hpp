// What the KV and varlen test problems (kv_problem.hpp, varlen_problem.hpp) keep on the device
// alike: q, k and v (dense tensors or a page pool) with the optional page table and seqused_k,
// and an output and LSE in q's view refilled with a poison byte before each run.
#pragma once

#include <cstddef>
#include <cstdint>
#include <optional>
#include <vector>

#include "flashjit/device_memory.hpp"
#include "flashjit/flashjit.hpp"
#include "poisoned_output.hpp"
#include "reference.hpp"

namespace flashjit::test {

class DeviceKvInputs {
 public:
  TensorView q() const { return with_data(q_view_, q_); }
  TensorView k() const { return with_data(k_view_, k_); }  // the dense tensor or the page pool
  TensorView v() const { return with_data(k_view_, v_); }
  TensorView out() const { return outputs_.out(); }
  float* lse() const { return outputs_.lse(); }
  const std::int32_t* seqused_k() const;   // null without seqused
  const std::int32_t* page_table() const;  // null without a page table

  // Refills the output and LSE with the poison byte; what the GPU wrote (after synchronizing).
  void poison(unsigned char value = 0xff) { outputs_.poison(value); }
  HostTensor output() const { return outputs_.output(); }  // in q's view
  std::vector<float> lse_values() const { return outputs_.lse_values(); }

 protected:
  // Device copies of the host data (an empty page_table or seqused: none), the output poisoned.
  DeviceKvInputs(const Engine& engine, const HostTensor& q, const HostTensor& k,
                 const HostTensor& v, const std::vector<std::int32_t>& page_table,
                 const std::vector<std::int32_t>& seqused, std::size_t lse_count,
                 unsigned char poison_byte);
  // New contents of the same sizes into the same buffers (synchronous copies).
  void upload(const HostTensor& q, const HostTensor& k, const HostTensor& v,
              const std::vector<std::int32_t>& page_table,
              const std::vector<std::int32_t>& seqused);
  // The cache over k and v: through the page table when paged, with seqused_k when given.
  KVCache kv_cache(bool paged, std::int64_t pages_per_seq) const;

 private:
  static TensorView with_data(TensorView view, const DeviceBuffer& buffer) {
    view.data = buffer.data();
    return view;
  }

  TensorView q_view_, k_view_;
  DeviceBuffer q_, k_, v_;
  PoisonedOutput outputs_;
  std::optional<DeviceBuffer> page_table_, seqused_;
};

}  // namespace flashjit::test

#include "poisoned_output.hpp"

#include <cstdint>

namespace flashjit::test {

PoisonedOutput::PoisonedOutput(const Engine& engine, const TensorView& view, std::size_t host_bits,
                               std::size_t lse_count)
    : view_(view),
      lse_count_(lse_count),
      out_(engine, host_bits * sizeof(std::uint16_t)),
      lse_(engine, lse_count * sizeof(float)) {}

TensorView PoisonedOutput::out() const {
  TensorView view = view_;
  view.data = out_.data();
  return view;
}

void PoisonedOutput::poison(unsigned char value) {
  out_.fill_bytes(value);
  lse_.fill_bytes(value);
}

HostTensor PoisonedOutput::output() const {
  HostTensor out;
  out.view = view_;
  out.bits.resize(out_.size() / sizeof(std::uint16_t));
  out_.download(out.bits.data(), out_.size());
  return out;
}

std::vector<float> PoisonedOutput::lse_values() const {
  std::vector<float> lse(lse_count_);
  lse_.download(lse.data(), lse.size() * sizeof(float));
  return lse;
}

}  // namespace flashjit::test

// Tensor views from a fuzzer's bytes, and what an accepted view must satisfy: shared by the
// harnesses of forward and backward argument validation.
#pragma once

#include <fmt/format.h>

#include <algorithm>
#include <cstdint>
#include <limits>
#include <string>
#include <vector>

#include "flashjit/flashjit.hpp"
#include "fuzz_input.hpp"
#include "invariant.hpp"

namespace flashjit::fuzz {

// A fake device address: 16-byte aligned unless the input asks for a misalignment.
inline void* fake_pointer(FuzzInput& in, int which) {
  const std::uint8_t mode = in.byte();
  if (mode == 0xff) return nullptr;
  const std::uintptr_t base = 0x7f0000000000u + 0x100000000u * static_cast<std::uintptr_t>(which);
  const std::uintptr_t misalign = (mode & 0xf0) == 0xf0 ? (mode & 0x0f) : 0;
  return reinterpret_cast<void*>(base + misalign);
}

// Arithmetic that wraps instead of overflowing: the harness itself must stay free of UB.
inline std::int64_t wrapping_mul(std::int64_t a, std::int64_t b) {
  return static_cast<std::int64_t>(static_cast<std::uint64_t>(a) * static_cast<std::uint64_t>(b));
}
inline std::int64_t wrapping_add(std::int64_t a, std::int64_t b) {
  return static_cast<std::int64_t>(static_cast<std::uint64_t>(a) + static_cast<std::uint64_t>(b));
}

inline TensorView fuzz_view(FuzzInput& in, int which, DType q_dtype) {
  TensorView view;
  view.data = fake_pointer(in, which);
  view.dtype = in.byte() % 8 == 7 ? (q_dtype == DType::bf16 ? DType::fp16 : DType::bf16) : q_dtype;
  for (auto& size : view.shape) size = in.integer();
  const auto [b, s, h, d] = view.shape;
  switch (in.byte() % 4) {
    case 0:  // BSHD, contiguous
      view.stride = {wrapping_mul(wrapping_mul(s, h), d), wrapping_mul(h, d), d, 1};
      break;
    case 1:  // BHSD, contiguous
      view.stride = {wrapping_mul(wrapping_mul(h, s), d), d, wrapping_mul(s, d), 1};
      break;
    case 2: {  // BSHD with padded rows
      const std::int64_t row = wrapping_add(wrapping_mul(h, d), in.integer());
      view.stride = {wrapping_mul(s, row), row, d, 1};
      break;
    }
    default:
      for (auto& stride : view.stride) stride = in.integer();
  }
  return view;
}

// The offset of the last element, if it fits in int64 (what a kernel computes per element).
inline bool last_offset_fits(const TensorView& t) {
  // An empty tensor has no element to address.
  if (std::find(t.shape.begin(), t.shape.end(), 0) != t.shape.end()) return true;
  std::int64_t offset = 0;
  for (int i = 0; i < 4; ++i) {
    std::int64_t step = 0;
    if (__builtin_mul_overflow(t.shape[i] - 1, t.stride[i], &step)) return false;
    if (__builtin_add_overflow(offset, step, &offset)) return false;
  }
  // Kernels address bytes as well as elements.
  std::int64_t bytes = 0;
  return !__builtin_mul_overflow(offset, std::int64_t{2}, &bytes);
}

inline void check_accepted_view(const char* name, const TensorView& t, const TensorView& q) {
  const std::string which(name);
  invariant(t.data != nullptr, which + ".data is null but accepted");
  invariant(reinterpret_cast<std::uintptr_t>(t.data) % 16 == 0,
            which + ".data misaligned but accepted");
  invariant(t.dtype == q.dtype, which + ".dtype differs from q but accepted");
  invariant(t.stride[3] == 1, which + ".stride[3] != 1 but accepted");
  for (int i = 0; i < 4; ++i)
    invariant(t.shape[i] >= 0 && t.shape[i] <= std::numeric_limits<std::int32_t>::max(),
              fmt::format("{}.shape[{}] = {} accepted", name, i, t.shape[i]));
  // An empty tensor's strides mean nothing (no element is addressed): only a non-empty one's
  // are held to the rules.
  const bool empty = std::find(t.shape.begin(), t.shape.end(), 0) != t.shape.end();
  for (int i = 0; i < 3 && !empty; ++i) {
    if (t.shape[i] <= 1) continue;
    invariant(t.stride[i] > 0 && t.stride[i] % 8 == 0,
              fmt::format("{}.stride[{}] = {} accepted", name, i, t.stride[i]));
  }
  invariant(last_offset_fits(t),
            which + ": the last element's offset overflows int64 but accepted");
}

// For a view a kernel writes: no two elements at one offset, checked element by element where
// the view is small enough (the fuzzer's shapes mostly are); true for larger ones.
inline bool small_view_overlap_free(const TensorView& t) {
  std::int64_t count = 1;
  for (const std::int64_t size : t.shape) {
    if (size == 0) return true;
    if (__builtin_mul_overflow(count, size, &count) || count > 4096) return true;
  }
  std::vector<std::int64_t> offsets;
  for (std::int64_t b = 0; b < t.shape[0]; ++b)
    for (std::int64_t s = 0; s < t.shape[1]; ++s)
      for (std::int64_t h = 0; h < t.shape[2]; ++h)
        for (std::int64_t d = 0; d < t.shape[3]; ++d)
          offsets.push_back(b * t.stride[0] + s * t.stride[1] + h * t.stride[2] + d * t.stride[3]);
  std::sort(offsets.begin(), offsets.end());
  return std::adjacent_find(offsets.begin(), offsets.end()) == offsets.end();
}

}  // namespace flashjit::fuzz

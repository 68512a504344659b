// Fuzzes forward-argument validation, the gate in front of every launch: shapes, strides,
// dtypes, pointers and options from the fuzzer's bytes (pointers are fake but aligned as asked:
// validation never dereferences them). Every input is either rejected with
// Error(invalid_argument) or accepted as a problem that keeps every documented rule, so no
// accepted call can make a kernel read out of bounds or compute with a broken scale.
#include <fmt/format.h>

#include <algorithm>
#include <cmath>
#include <cstddef>
#include <cstdint>
#include <limits>
#include <string>

#include "flashjit/flashjit.hpp"
#include "fuzz_input.hpp"
#include "invariant.hpp"
#include "api/validate.hpp"

using flashjit::DType;
using flashjit::Error;
using flashjit::ErrorCode;
using flashjit::ForwardOptions;
using flashjit::TensorView;
using flashjit::fuzz::FuzzInput;
using flashjit::fuzz::invariant;

namespace {

// A fake device address: 16-byte aligned unless the input asks for a misalignment.
void* fake_pointer(FuzzInput& in, int which) {
  const std::uint8_t mode = in.byte();
  if (mode == 0xff) return nullptr;
  const std::uintptr_t base = 0x7f0000000000u + 0x100000000u * static_cast<std::uintptr_t>(which);
  const std::uintptr_t misalign = (mode & 0xf0) == 0xf0 ? (mode & 0x0f) : 0;
  return reinterpret_cast<void*>(base + misalign);
}

// Arithmetic that wraps instead of overflowing: the harness itself must stay free of UB.
std::int64_t wrapping_mul(std::int64_t a, std::int64_t b) {
  return static_cast<std::int64_t>(static_cast<std::uint64_t>(a) * static_cast<std::uint64_t>(b));
}
std::int64_t wrapping_add(std::int64_t a, std::int64_t b) {
  return static_cast<std::int64_t>(static_cast<std::uint64_t>(a) + static_cast<std::uint64_t>(b));
}

TensorView fuzz_view(FuzzInput& in, int which, DType q_dtype) {
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
bool last_offset_fits(const TensorView& t) {
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

void check_accepted_view(const char* name, const TensorView& t, const TensorView& q) {
  const std::string which(name);
  invariant(t.data != nullptr, which + ".data is null but accepted");
  invariant(reinterpret_cast<std::uintptr_t>(t.data) % 16 == 0,
            which + ".data misaligned but accepted");
  invariant(t.dtype == q.dtype, which + ".dtype differs from q but accepted");
  invariant(t.stride[3] == 1, which + ".stride[3] != 1 but accepted");
  for (int i = 0; i < 4; ++i)
    invariant(t.shape[i] >= 0 && t.shape[i] <= std::numeric_limits<std::int32_t>::max(),
              fmt::format("{}.shape[{}] = {} accepted", name, i, t.shape[i]));
  for (int i = 0; i < 3; ++i) {
    if (t.shape[i] <= 1) continue;
    invariant(t.stride[i] > 0 && t.stride[i] % 8 == 0,
              fmt::format("{}.stride[{}] = {} accepted", name, i, t.stride[i]));
  }
  invariant(last_offset_fits(t),
            which + ": the last element's offset overflows int64 but accepted");
}

void check_accepted(const flashjit::detail::ForwardProblem& problem, const TensorView& q,
                    const TensorView& k, const TensorView& v, const TensorView& out,
                    const ForwardOptions& options) {
  check_accepted_view("q", q, q);
  check_accepted_view("k", k, q);
  check_accepted_view("v", v, q);
  check_accepted_view("out", out, q);
  invariant(out.shape == q.shape, "out.shape differs from q");
  invariant(k.shape == v.shape, "v.shape differs from k");
  invariant(k.shape[0] == q.shape[0] && k.shape[3] == q.shape[3], "k batch/head_dim differ from q");
  const auto dims = flashjit::supported_head_dims();
  invariant(std::find(dims.begin(), dims.end(), q.shape[3]) != dims.end(),
            "unsupported head_dim accepted");
  invariant(problem.batch <= 65535 && problem.heads_q <= 65535, "grid limit exceeded");
  if (problem.heads_q > 0) {
    invariant(problem.heads_kv > 0 && problem.heads_q % problem.heads_kv == 0,
              "heads_q not a multiple of heads_kv accepted");
    invariant(problem.params.heads_per_kv * problem.heads_kv == problem.heads_q,
              "heads_per_kv does not map q heads onto kv heads");
  }
  invariant(problem.empty() || problem.seqlen_k > 0,
            "seqlen_k == 0 accepted for a non-empty problem");
  invariant(std::isfinite(problem.softmax_scale) && problem.softmax_scale > 0,
            "bad softmax_scale accepted");
  invariant(std::isfinite(problem.params.scale_log2) && problem.params.scale_log2 > 0,
            fmt::format("softmax_scale {} accepted but its log2 form {} is not finite",
                        problem.softmax_scale, problem.params.scale_log2));
  invariant(reinterpret_cast<std::uintptr_t>(options.lse) % 4 == 0, "misaligned lse accepted");
  invariant(problem.params.q == q.data && problem.params.o == out.data &&
                problem.params.q_stride_s == q.stride[1] &&
                problem.params.v_stride_h == v.stride[2] && problem.params.seqlen_q == q.shape[1] &&
                problem.params.seqlen_k == k.shape[1],
            "kernel params do not mirror the arguments");
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  FuzzInput in(data, size);
  const DType dtype = in.flag() ? DType::fp16 : DType::bf16;
  const TensorView q = fuzz_view(in, 0, dtype);
  const TensorView k = fuzz_view(in, 1, dtype);
  const TensorView v = fuzz_view(in, 2, dtype);
  const TensorView out = fuzz_view(in, 3, dtype);
  ForwardOptions options;
  options.causal = in.flag();
  if (in.flag()) options.softmax_scale = in.raw<float>();
  if (in.flag()) options.lse = static_cast<float*>(fake_pointer(in, 4));

  flashjit::detail::ForwardProblem problem;
  try {
    problem = flashjit::detail::validate_forward(q, k, v, out, options);
  } catch (const Error& error) {
    invariant(error.code() == ErrorCode::invalid_argument,
              std::string("rejection is not invalid_argument: ") + error.what());
    return 0;
  }
  check_accepted(problem, q, k, v, out, options);
  return 0;
}

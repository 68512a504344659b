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
#include "fuzz_views.hpp"
#include "invariant.hpp"
#include "api/validate.hpp"

namespace flashjit::fuzz {
namespace {

void check_accepted(const flashjit::detail::ForwardProblem& problem, const TensorView& q,
                    const TensorView& k, const TensorView& v, const TensorView& out,
                    const ForwardOptions& options) {
  check_accepted_view("q", q, q);
  check_accepted_view("k", k, q);
  check_accepted_view("v", v, q);
  check_accepted_view("out", out, q);
  invariant(out.shape == q.shape, "out.shape differs from q");
  invariant(flashjit::fuzz::small_view_overlap_free(out), "out's elements overlap but accepted");
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

int test_one_input(const std::uint8_t* data, std::size_t size) {
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

}  // namespace flashjit::fuzz

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  return flashjit::fuzz::test_one_input(data, size);
}

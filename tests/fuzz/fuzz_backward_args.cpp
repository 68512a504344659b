// Fuzzes backward-argument validation, the gate in front of every backward launch: the forward's
// tensors, dO, the three gradients, the LSE, the workspace and the options from the fuzzer's bytes
// (fake pointers, aligned as asked). Every input is either rejected with Error(invalid_argument)
// or accepted as a problem whose tensors, workspace and params keep every documented rule, so no
// accepted call can make a kernel write out of bounds (a workspace sized by an overflowed product
// included).
#include <fmt/format.h>

#include <cmath>
#include <cstddef>
#include <cstdint>
#include <string>

#include "api/validate_backward.hpp"
#include "common/bwd_workspace.cuh"
#include "flashjit/flashjit.hpp"
#include "fuzz_input.hpp"
#include "fuzz_views.hpp"
#include "invariant.hpp"

namespace flashjit::fuzz {
namespace {

struct Arguments {
  TensorView q, k, v, out, dout, dq, dk, dv;
  const float* lse = nullptr;
  BackwardOptions options;
};

// The workspace's size recomputed with every operation checked (its four parts, the two row
// terms, the tile counter and the accumulator, each rounded up to 256 bytes at most): false where
// it overflows.
bool workspace_bytes_fit(const flashjit::detail::BackwardProblem& problem, std::size_t& bytes) {
  const auto& f = problem.forward;
  const long long per_head = f.varlen ? 1 : f.batch;
  long long rows = 0, floats = 0;
  std::size_t terms = 0, accumulator = 0, total = 0;
  if (__builtin_mul_overflow(per_head, static_cast<long long>(f.heads_q), &rows) ||
      __builtin_mul_overflow(rows, static_cast<long long>(problem.params.seqlen_rows), &rows) ||
      __builtin_mul_overflow(rows, static_cast<long long>(f.head_dim), &floats) ||
      __builtin_mul_overflow(static_cast<std::size_t>(rows), sizeof(float), &terms) ||
      __builtin_mul_overflow(static_cast<std::size_t>(floats), sizeof(float), &accumulator) ||
      __builtin_add_overflow(terms, terms, &total) ||
      __builtin_add_overflow(total, accumulator, &total) ||
      __builtin_add_overflow(total, std::size_t{4 * 256}, &total))
    return false;
  bytes = (problem.dq_accumulator ? 2 * terms + accumulator : 2 * terms) + sizeof(int);
  return true;
}

void check_accepted(const flashjit::detail::BackwardProblem& problem, const Arguments& a,
                    const VarlenBatch* varlen) {
  const TensorView& q = a.q;
  for (const auto& [name, view] :
       {std::pair{"q", &a.q}, {"k", &a.k}, {"v", &a.v}, {"out", &a.out}, {"dout", &a.dout},
        {"dq", &a.dq}, {"dk", &a.dk}, {"dv", &a.dv}})
    check_accepted_view(name, *view, q);
  invariant(a.out.shape == q.shape && a.dout.shape == q.shape && a.dq.shape == q.shape,
            "out, dout or dq shaped unlike q but accepted");
  invariant(a.k.shape == a.v.shape && a.dk.shape == a.k.shape && a.dv.shape == a.k.shape,
            "v, dk or dv shaped unlike k but accepted");
  for (const auto& [name, view] : {std::pair{"dq", &a.dq}, {"dk", &a.dk}, {"dv", &a.dv}})
    invariant(flashjit::fuzz::small_view_overlap_free(*view),
              std::string(name) + "'s elements overlap but accepted");
  invariant(a.lse != nullptr && reinterpret_cast<std::uintptr_t>(a.lse) % 4 == 0,
            "null or misaligned lse accepted");
  const auto& f = problem.forward;
  invariant(std::isfinite(f.softmax_scale) && f.softmax_scale > 0 &&
                problem.params.dscore_scale == f.softmax_scale,
            "bad softmax_scale accepted, or dS not scaled by it");
  if (a.options.d_sink_logits != nullptr)
    invariant(a.options.sink_logits != nullptr &&
                  reinterpret_cast<std::uintptr_t>(a.options.d_sink_logits) % 4 == 0,
              "d_sink_logits accepted without sink_logits, or misaligned");
  invariant(problem.params.dsink == a.options.d_sink_logits, "dsink does not mirror d_sink_logits");
  if (a.options.workspace != nullptr)
    invariant(reinterpret_cast<std::uintptr_t>(a.options.workspace) % 256 == 0,
              "misaligned workspace accepted");
  if (varlen != nullptr && varlen->batch > 0) {
    invariant(q.shape[0] == 1 && a.k.shape[0] == 1 && varlen->cu_seqlens_q != nullptr &&
                  varlen->cu_seqlens_k != nullptr && f.varlen && f.total_q == q.shape[1],
              "a varlen backward accepted over unpacked views or without cu_seqlens");
    // Each sequence's rows padded to the quantum, plus one quantum per sequence (packed_rows).
    invariant(problem.params.seqlen_rows >=
                  f.total_q + static_cast<long long>(varlen->batch) *
                                  flashjit::BwdWorkspaceRows::kRowQuantum,
              "the varlen workspace rows do not cover every sequence's padding");
  }
  // (An empty problem runs nothing; a varlen batch of 0 sequences keeps its unchecked hints.)
  invariant(f.empty() || problem.params.seqlen_rows >= f.seqlen_q,
            fmt::format("seqlen_rows {} does not cover seqlen_q {}", problem.params.seqlen_rows,
                        f.seqlen_q));
  invariant(problem.params.seqlen_rows % flashjit::BwdWorkspaceRows::kRowQuantum == 0,
            fmt::format("seqlen_rows {} is not whole tiles of rows", problem.params.seqlen_rows));
  std::size_t bytes = 0;
  invariant(workspace_bytes_fit(problem, bytes),
            fmt::format("the workspace of {} x {} heads x {} rows x head_dim {} overflows but was "
                        "accepted",
                        f.batch, f.heads_q, problem.params.seqlen_rows, f.head_dim));
  invariant(problem.workspace_bytes() >= bytes,
            fmt::format("workspace_bytes() {} is less than its parts, {}",
                        problem.workspace_bytes(), bytes));
  const auto& p = problem.params;
  invariant(p.dout == a.dout.data && p.dq == a.dq.data && p.dk == a.dk.data &&
                p.dv == a.dv.data && p.do_stride_s == a.dout.stride[1] &&
                p.dq_stride_h == a.dq.stride[2] && p.dk_stride_b == a.dk.stride[0] &&
                p.dv_stride_s == a.dv.stride[1] && p.fwd.q == q.data,
            "kernel params do not mirror the arguments");
}

}  // namespace

int test_one_input(const std::uint8_t* data, std::size_t size) {
  FuzzInput in(data, size);
  const DType dtype = in.flag() ? DType::fp16 : DType::bf16;
  Arguments a;
  // Most inputs take the gradients' views as copies of the forward's (other addresses), so the
  // fuzzer reaches accepted problems; the rest draw every view.
  const bool alike = in.byte() % 4 != 0;
  a.q = fuzz_view(in, 0, dtype);
  a.k = fuzz_view(in, 1, dtype);
  a.v = alike ? a.k : fuzz_view(in, 2, dtype);
  a.out = alike ? a.q : fuzz_view(in, 3, dtype);
  a.dout = alike ? a.q : fuzz_view(in, 4, dtype);
  a.dq = alike ? a.q : fuzz_view(in, 5, dtype);
  a.dk = alike ? a.k : fuzz_view(in, 6, dtype);
  a.dv = alike ? a.k : fuzz_view(in, 7, dtype);
  if (alike) {
    int which = 2;
    for (TensorView* view : {&a.v, &a.out, &a.dout, &a.dq, &a.dk, &a.dv})
      view->data = fake_pointer(in, which++);
  }
  a.lse = static_cast<const float*>(fake_pointer(in, 8));
  BackwardOptions& o = a.options;
  o.causal = in.flag();
  o.deterministic = in.flag();
  if (in.flag()) o.softmax_scale = in.raw<float>();
  if (in.flag()) {
    o.workspace = fake_pointer(in, 9);
    o.workspace_bytes = static_cast<std::size_t>(in.integer());
  }
  if (in.flag()) o.sink_logits = static_cast<const float*>(fake_pointer(in, 10));
  if (in.flag()) o.d_sink_logits = static_cast<float*>(fake_pointer(in, 11));
  if (in.flag()) o.softcap = in.raw<float>();
  if (in.flag()) {
    o.window_left = static_cast<int>(in.integer());
    o.window_right = static_cast<int>(in.integer());
  }
  // A varlen batch, read last so that inputs without these bytes stay dense ones.
  VarlenBatch varlen;
  const bool use_varlen = in.flag();
  if (use_varlen) {
    varlen.batch = static_cast<int>(in.integer());
    varlen.cu_seqlens_q = static_cast<const std::int32_t*>(fake_pointer(in, 12));
    varlen.cu_seqlens_k = static_cast<const std::int32_t*>(fake_pointer(in, 13));
    varlen.max_seqlen_q = static_cast<int>(in.integer());
    varlen.max_seqlen_k = static_cast<int>(in.integer());
  }

  const VarlenBatch* batch = use_varlen ? &varlen : nullptr;
  // The workspace query (Engine::backward_workspace_bytes) sees q, k and v alone: q, an input,
  // may overlap itself there at any size, so its workspace is checked on its own.
  try {
    const auto query = flashjit::detail::validate_backward(a.q, a.k, a.v, batch, a.options);
    std::size_t bytes = 0;
    invariant(workspace_bytes_fit(query, bytes) && query.workspace_bytes() >= bytes,
              "the workspace query accepted a workspace whose size overflows");
  } catch (const Error& error) {
    invariant(error.code() == ErrorCode::invalid_argument,
              std::string("query rejection is not invalid_argument: ") + error.what());
  }
  flashjit::detail::BackwardProblem problem;
  try {
    problem = flashjit::detail::validate_backward(a.q, a.k, a.v, a.out, a.dout, a.lse, a.dq, a.dk,
                                                  a.dv, batch, a.options);
  } catch (const Error& error) {
    invariant(error.code() == ErrorCode::invalid_argument,
              std::string("rejection is not invalid_argument: ") + error.what());
    return 0;
  }
  check_accepted(problem, a, batch);
  return 0;
}

}  // namespace flashjit::fuzz

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  return flashjit::fuzz::test_one_input(data, size);
}

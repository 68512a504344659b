#include "api/split_kv.hpp"

namespace flashjit::detail {
namespace {

constexpr std::size_t kAlignment = 256;

std::size_t round_up(std::size_t bytes) { return (bytes + kAlignment - 1) / kAlignment * kAlignment; }

}  // namespace

SplitPlan plan_splits(const KernelFamily& family, const Variant& variant,
                      const ForwardProblem& problem, const DeviceInfo& device) {
  SplitPlan split;
  const int tiles = problem.key_tiles_seen(variant.tile_n);
  split.split_tiles = tiles;
  if (family.num_splits == nullptr) return split;
  split.num_splits = family.num_splits(variant, problem, device);
  split.split_tiles = (tiles + split.num_splits - 1) / split.num_splits;
  if (split.num_splits == 1) return split;
  const std::size_t rows = static_cast<std::size_t>(problem.batch) * problem.seqlen_q *
                           problem.heads_q * static_cast<std::size_t>(split.num_splits);
  split.lse_offset = round_up(rows * problem.head_dim * sizeof(float));
  split.workspace_bytes = split.lse_offset + round_up(rows * sizeof(float));
  return split;
}

MergeParams split_merge_params(const FmhaParams& p, int head_dim) {
  MergeParams m{};
  const long long rows = static_cast<long long>(p.batch) * p.seqlen_q * p.heads_q;
  m.o_in = p.o_partial;
  m.o_stride_state = rows * head_dim;
  m.o_stride_b = static_cast<long long>(p.seqlen_q) * p.heads_q * head_dim;
  m.o_stride_s = static_cast<long long>(p.heads_q) * head_dim;
  m.o_stride_h = head_dim;
  m.lse_in = p.lse_partial;
  m.lse_stride_state = rows;
  m.lse_stride_b = static_cast<long long>(p.seqlen_q) * p.heads_q;
  m.lse_stride_s = p.heads_q;
  m.lse_stride_h = 1;
  m.o_out = p.o;
  m.lse_out = p.lse;
  m.out_stride_b = p.o_stride_b, m.out_stride_s = p.o_stride_s, m.out_stride_h = p.o_stride_h;
  m.batch = p.batch;
  m.seqlen = p.seqlen_q;
  m.heads = p.heads_q;
  m.num_states = p.num_splits;
  m.input_is_fp32 = 1;
  m.cu_seqlens = p.cu_seqlens_q;
  m.total = p.total_q;
  return m;
}

}  // namespace flashjit::detail

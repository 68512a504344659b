#include "api/launch_plans.hpp"

#include <fmt/format.h>
#include <xxhash.h>

#include "core/user_functions.hpp"

namespace flashjit::detail {

CUfunction KernelHandle::entry(bool reads_block_mask) const {
  if (!reads_block_mask) return function;
  // Block masks are made for variants with a mask_mod only, and those have the entry.
  if (block_mask_function == nullptr)
    throw Error(ErrorCode::unsupported,
                fmt::format("{} has no entry that reads a block mask: expected a variant with a "
                            "mask_mod",
                            kernel->entry.variant.name()));
  return block_mask_function;
}

PlanKey PlanKey::of(CUcontext context, const ForwardProblem& problem,
                    const KernelFamily* forced_family, const std::optional<TileConfig>& tiles) {
  const FmhaParams& p = problem.params;
  PlanKey key;
  key.context = context;
  key.forced_family = forced_family;
  key.strides = {p.q_stride_b, p.q_stride_s, p.q_stride_h, p.k_stride_b, p.k_stride_s,
                 p.k_stride_h, p.v_stride_b, p.v_stride_s, p.v_stride_h, p.o_stride_b,
                 p.o_stride_s, p.o_stride_h, p.page_table_stride};
  key.sizes = {problem.batch,    problem.heads_q,  problem.heads_kv,
               problem.seqlen_q, problem.seqlen_k, problem.head_dim};
  key.dtype = static_cast<std::int32_t>(problem.dtype);
  key.causal = problem.causal;
  key.paged = problem.paged;
  key.page_size = problem.page_size;
  key.num_pages = problem.num_pages;
  key.varlen = problem.varlen;
  key.total_q = problem.total_q;
  key.total_k = problem.total_k;
  key.has_seqused = problem.has_seqused;
  key.num_splits = problem.num_splits;
  key.softcap = problem.softcap > 0.f;
  key.window = problem.window;
  key.window_left = p.window_left;
  key.window_right = p.window_right;
  key.sink_tokens = p.sink_tokens;
  key.sink = problem.sink;
  key.alibi = problem.alibi;
  key.user_functions = user_functions_key(problem.user_functions);
  if (tiles) {
    key.tile_m = tiles->tile_m;
    key.tile_n = tiles->tile_n;
    key.stages = tiles->stages;
  }
  return key;
}

std::size_t hash_key_bytes(const void* key, std::size_t size) { return XXH3_64bits(key, size); }

}  // namespace flashjit::detail

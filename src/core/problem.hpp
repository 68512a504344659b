// A validated forward call: sizes, strides and options, independent of any kernel.
#pragma once

#include <algorithm>
#include <string_view>

#include "common/params.cuh"
#include "flashjit/flashjit.hpp"

namespace flashjit::detail {

struct ForwardProblem {
  DType dtype = DType::bf16;
  // seqlen_k: the keys' capacity (paged: pages_per_seq * page_size); seqused_k may lower it per
  // sequence on the device.
  int batch = 0, heads_q = 0, heads_kv = 0, seqlen_q = 0, seqlen_k = 0, head_dim = 0;
  bool causal = false;
  bool paged = false;
  int page_size = 0;          // paged only
  int num_pages = 0;          // paged only: pages in the cache (TMA maps bound them)
  bool has_seqused = false;   // seqused_k given
  int num_splits = 0;         // ForwardOptions::num_splits: 0 = the heuristic's
  // Varlen batches: seqlen_q and seqlen_k are the longest sequence's (the hints); q and o have
  // total_q rows, a dense k and v total_k.
  bool varlen = false;
  int total_q = 0, total_k = 0;
  float softmax_scale = 1.f;
  float softcap = 0.f;  // ForwardOptions::softcap: > 0 runs a Variant::softcap kernel
  bool window = false;  // a sliding window (ForwardOptions::window_*): a Variant::window kernel
  bool sink = false;    // attention sinks (ForwardOptions::sink_logits): a Variant::sink kernel
  bool alibi = false;   // ALiBi (ForwardOptions::alibi_slopes): a Variant::alibi kernel
  // User functions (ForwardOptions::user_functions): their hash, a Variant::user_functions kernel;
  // empty: none. Points into the caller's UserFunctions, alive through the call.
  std::string_view user_functions;
  bool score_mod = false, mask_mod = false;
  bool block_mask = false;  // ForwardOptions::block_mask given
  FmhaParams params{};  // pointers and strides, ready for a kernel

  bool empty() const { return batch == 0 || heads_q == 0 || seqlen_q == 0; }
  // Sequences of their own lengths: a varlen batch, or keys cut per sequence by seqused_k.
  bool per_sequence_lengths() const { return varlen || has_seqused; }
  // Query rows that share one KV head: what the decode family packs into one tile.
  long long rows_per_kv_head() const {
    return static_cast<long long>(seqlen_q) * (heads_kv > 0 ? heads_q / heads_kv : 1);
  }
  // The most key tiles of tile_n keys that the query rows of one sequence see (what split-KV
  // divides): all of them, or under a window its band over seqlen_q rows, plus one tile for the
  // band's misalignment with the tiles, plus the tiles of the sink tokens before it. Where the
  // sink tiles overlap the band's, the band reaches back to them and so runs through every tile
  // to the end: the cap at `all` is then their union, no tile counted twice.
  int key_tiles_seen(int tile_n) const {
    const int all = (seqlen_k + tile_n - 1) / tile_n;
    if (!window) return all;
    const long long band =
        static_cast<long long>(seqlen_q) + params.window_left + params.window_right;
    const long long sinks = (static_cast<long long>(params.sink_tokens) + tile_n - 1) / tile_n;
    return static_cast<int>(std::min<long long>(all, sinks + (band + tile_n - 1) / tile_n + 1));
  }
};

}  // namespace flashjit::detail

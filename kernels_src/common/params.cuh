// The argument blocks kernels take by value. Plain C++: the host (src/core/problem.hpp) fills these
// very structs, so the two sides cannot disagree on their layout.
#pragma once

namespace flashjit {

// log2(e): scores and logits in natural-log units times this go straight into exp2
// (FmhaParams::scale_log2, a sink's logit).
constexpr float kLog2e = 1.4426950408889634f;

// A window side left unbounded (ForwardOptions::window_* = -1): farther than any key.
constexpr int kUnboundedWindow = 1 << 30;

// Read-only device pointers a kernel's user functions see (ForwardOptions::user_args; the count
// is the public kMaxUserArgs).
constexpr int kUserArgCount = 8;
struct UserArgs {
  const void* ptr[kUserArgCount];
};

constexpr int kBlockCounts = 3;  // numbers per block-mask entry: full, partial, visitable

struct FmhaParams {
  const void* q;  // [batch, seqlen_q, heads_q, head_dim], strides below, unit stride in head_dim
  const void* k;  // [batch, seqlen_k, heads_kv, head_dim]; paged: pages, see page_table
  const void* v;  // like k
  void* o;        // [batch, seqlen_q, heads_q, head_dim]
  float* lse;     // optional [batch, heads_q, seqlen_q], natural log; nullptr: not written
  long long q_stride_b, q_stride_s, q_stride_h;  // in elements; paged k/v: b = page, s = row
  long long k_stride_b, k_stride_s, k_stride_h;
  long long v_stride_b, v_stride_s, v_stride_h;
  long long o_stride_b, o_stride_s, o_stride_h;
  int batch, heads_q, heads_kv, seqlen_q, seqlen_k;  // paged: seqlen_k = pages_per_seq * page_size
  int heads_per_kv;     // heads_q / heads_kv (GQA group size)
  float scale_log2;     // softmax_scale * log2(e): scores go straight into exp2
  float softmax_scale;  // kept for the natural-log LSE
  // Soft-capped variants (Variant::softcap): a score becomes softcap * tanh(q·k * softcap_scale),
  // softcap_scale = softmax_scale / softcap, already in natural-log units, so the host sets
  // scale_log2 = log2(e) and softmax_scale = 1 for them.
  float softcap, softcap_scale;
  // Sliding-window variants (Variant::window): row i sees keys [i + d - window_left,
  // i + d + window_right], d = seqlen_k - seqlen_q; an unbounded side is kUnboundedWindow. Keys
  // j < sink_tokens (StreamingLLM; 0 without) are seen too, up to the right side.
  int window_left, window_right;
  int sink_tokens;
  // Sink variants (Variant::sink): fp32 [heads_q], one more logit per query head in each row's
  // softmax denominator (gpt-oss's learnable sinks), in the units of the scaled scores.
  const float* sink_logits;
  // ALiBi variants (Variant::alibi): fp32 [heads_q] slopes; the scaled score of (i, j) gets
  // -slope * |i + seqlen_k - seqlen_q - j|.
  const float* alibi_slopes;

  // User-function variants (Variant::user_functions): what their score_mod and mask_mod read.
  // With a score_mod the host sets scale_log2 = log2(e) and softmax_scale = 1 (scores leave it in
  // natural-log units) and user_score_scale to what takes a raw score there (softmax_scale, 1
  // when soft-capped: capped scores already are).
  UserArgs user_args;
  float user_score_scale;
  // A block mask (ForwardOptions::block_mask; user-function variants with a mask_mod): query tile
  // t of sequence b and head h has entry r = b * block_stride_b + h * block_stride_h + t (a stride
  // is 0 for a map shared by every batch or head); block_counts[kBlockCounts r] key tiles that no
  // mask touches and block_counts[kBlockCounts r + 1] partly masked ones are listed at
  // block_tiles[r * block_key_tiles] (common/masking.cuh, TileVisits); block_counts[kBlockCounts r
  // + 2] is how many the causal / window masks alone would visit (for BlockMask::counts). nullptr:
  // none.
  const int* block_counts;
  const int* block_tiles;
  long long block_stride_b, block_stride_h;
  int block_key_tiles;

  // Paged KV cache (families with the paged feature): key j of sequence b is row j % page_size of
  // page page_table[b * page_table_stride + j / page_size].
  const int* page_table;
  long long page_table_stride;
  int page_size;
  // Optional [batch]: keys valid in each sequence (<= seqlen_k); the causal mask aligns to it.
  const int* seqused_k;

  // Variable-length batches (families with the varlen feature): cu_seqlens_q [batch + 1] packs
  // the queries of sequence b at rows [cu_seqlens_q[b], cu_seqlens_q[b + 1]) of q and o (batch
  // strides unused), seqlen_q being the longest; cu_seqlens_k the same for a dense k and v
  // (nullptr for a paged cache). The LSE is then [heads_q, total_q].
  const int* cu_seqlens_q;
  const int* cu_seqlens_k;
  int total_q;

  // Split-KV (the decode family): split s of num_splits covers key tiles [s * split_tiles,
  // (s + 1) * split_tiles). With num_splits > 1 each split writes its normalized partial output
  // and LSE for row r = (b * seqlen_q + i) * heads_q + h to o_partial[(s * rows + r) * head_dim]
  // and lse_partial[s * rows + r]; the merge kernel combines them.
  int num_splits;
  int split_tiles;
  float* o_partial;
  float* lse_partial;
  // Dense causal wgmma launches (WgmmaSchedule::lpt_group_pairs): two ints of device memory, zero
  // between launches, from which the CTAs take their work units as they free up (wgmma/
  // schedule.cuh's schedule_units; the last CTA zeroes them again). nullptr: a static order.
  int* tile_counter;  // kTileCounterInts of them
};
constexpr int kTileCounterInts = 2;  // the next unit to take; the CTAs done taking

// The backward pass (Engine::backward): the forward's arguments (q, k, v, o = its output, lse =
// its LSE as input, sizes, strides, scale, masks) and the gradients'. Every backward kernel takes
// this block, each reading what it needs.
struct BackwardParams {
  FmhaParams fwd;
  const void* dout;  // dL/dO, the shape and (own) strides of o
  void* dq;          // the shapes of q, k, v; own strides
  void* dk;
  void* dv;
  long long do_stride_b, do_stride_s, do_stride_h;
  long long dq_stride_b, dq_stride_s, dq_stride_h;
  long long dk_stride_b, dk_stride_s, dk_stride_h;
  long long dv_stride_b, dv_stride_s, dv_stride_h;
  // Workspace, rows laid out as common/bwd_workspace.cuh says (per sequence and query head,
  // padded to whole tiles; seqlen_rows of them per (batch, head), or per head for a varlen batch):
  // delta = rowsum(dO ∘ O) (0 on padding rows), lse_log2 = the LSE times log2(e) (+inf on
  // padding rows and rows that saw no key, so their probabilities are exactly 0), fp32 each;
  // dq_accum fp32 head_dim a row, summed by atomics from every key tile (nullptr: deterministic
  // mode, a dQ kernel of its own).
  float* delta;
  float* lse_log2;
  float* dq_accum;
  int seqlen_rows;
  // 1: dq_accum holds 64 x 64 blocks in a wgmma accumulator's register order (BwdDqBlocks,
  // written by bwd_wgmma_fused), 0: row-major.
  int dq_accum_blocks;
  // d score / d(q·k) before a soft-cap's own factor: the forward's softmax_scale (fwd's is 1 for
  // soft-capped variants, whose scores come out scaled); dK and dQ are dscore_scale · dS K / Q.
  float dscore_scale;
  // Optional fp32 [heads_q] (learnable sinks, BackwardOptions::d_sink_logits): bwd_sink writes
  // dL/dsink = -Σ_rows exp(sink - lse) · delta there; nullptr: not computed.
  float* dsink;
  // The workspace's counter of taken dK/dV tiles (bwd_wgmma/key_tile_walk.cuh), zeroed by
  // bwd_prep; nullptr where there is no workspace (seqlen_q 0): the tiles are dealt.
  int* tile_counter;
};

// Merges num_states partial attention results per row (split-KV partials, or the public
// merge_attention_states): out = sum_i e^(lse_i - m) o_i / sum_i e^(lse_i - m).
struct MergeParams {
  const void* o_in;  // state i, row (b, s, h): o_in + i * o_stride_state + b * o_stride_b + ...
  const float* lse_in;
  long long o_stride_state, o_stride_b, o_stride_s, o_stride_h;  // elements of the input type
  long long lse_stride_state, lse_stride_b, lse_stride_s, lse_stride_h;
  void* o_out;     // [batch, seqlen, heads, head_dim] of the output type
  float* lse_out;  // optional [batch, heads, seqlen] contiguous
  long long out_stride_b, out_stride_s, out_stride_h;
  int batch, seqlen, heads, num_states;
  int input_is_fp32;  // 1: o_in is float (split partials); 0: the output's 16-bit type
  // Varlen outputs: row (b, s, h) goes to o_out row cu_seqlens[b] + s (out_stride_b unused), the
  // LSE to lse_out[h * total + cu_seqlens[b] + s], and rows s >= the sequence's length are skipped.
  const int* cu_seqlens;
  int total;
};

}  // namespace flashjit

/* flashjit C API: the C++ API behind status codes and a per-thread error message, for FFI
 * (ctypes, cffi, Rust, ...). Every function returns FLASHJIT_OK or a status, and on failure
 * flashjit_last_error() names what was wrong. Nothing is launched when a call fails. */
#ifndef FLASHJIT_FLASHJIT_H
#define FLASHJIT_FLASHJIT_H

#include <stdint.h>

#include "flashjit/export.h"

#ifdef __cplusplus
extern "C" {
#endif

typedef enum flashjit_status {
  FLASHJIT_OK = 0,
  FLASHJIT_INVALID_ARGUMENT = 1,
  FLASHJIT_NO_DRIVER = 2,
  FLASHJIT_NO_DEVICE = 3,
  FLASHJIT_COMPILE_FAILED = 4,
  FLASHJIT_CUDA_ERROR = 5,
  FLASHJIT_CACHE_ERROR = 6,
  FLASHJIT_UNSUPPORTED = 7,
  FLASHJIT_INTERNAL_ERROR = 8
} flashjit_status;

typedef enum flashjit_dtype { FLASHJIT_BF16 = 0, FLASHJIT_FP16 = 1 } flashjit_dtype;

/* [batch, seqlen, heads, head_dim] view of device memory; strides in elements, stride[3] == 1. */
typedef struct flashjit_tensor {
  void* data;
  int32_t dtype; /* flashjit_dtype */
  int64_t shape[4];
  int64_t stride[4];
} flashjit_tensor;

/* User functions (flashjit::UserFunctions, docs/variants.md "User functions"): CUDA C source of
 * score_mod and / or mask_mod that NVRTC compiles into the attention kernel. Made by
 * flashjit_user_functions_create or _from_files; a forward takes it in
 * flashjit_forward_options.user_functions, and the pointers the functions read in user_args. */
typedef struct flashjit_user_functions flashjit_user_functions;
/* Key tiles to skip (flashjit::BlockMask): made by flashjit_block_mask_create* for the arguments of
 * one forward, passed to it in flashjit_forward_options.block_mask. */
typedef struct flashjit_block_mask flashjit_block_mask;

/* The pointers user functions see as args.ptr[0 .. FLASHJIT_MAX_USER_ARGS) (flashjit::kMaxUserArgs). */
#define FLASHJIT_MAX_USER_ARGS 8

typedef struct flashjit_forward_options {
  float softmax_scale; /* <= 0: 1/sqrt(head_dim) */
  int32_t causal;      /* bottom-right aligned when seqlen_q != seqlen_k */
  float* lse;          /* optional fp32 [batch, heads_q, seqlen_q], contiguous; may be NULL */
  const char* family;  /* NULL or "": the dispatcher's choice; else a flashjit_family_name() */
  /* All three 0: the family's tile table. Else a forced tile shape (tuning, benchmarks); one the
   * family cannot build fails with FLASHJIT_INVALID_ARGUMENT. */
  int32_t tile_m, tile_n, stages;
  /* Split-KV (decode family): 0 for the heuristic's choice, else 1 to 128 splits. */
  int32_t num_splits;
  /* Optional scratch of at least flashjit_workspace_bytes() bytes; NULL: the engine's own. */
  void* workspace;
  uint64_t workspace_bytes;
  /* Logit soft-capping: > 0 caps scores at softcap * tanh(score / softcap); 0: off. */
  float softcap;
  /* Sliding window: nonzero applies window_left / window_right (ForwardOptions: query row i sees
   * keys [i + d - window_left, i + d + window_right], d = seqlen_k - seqlen_q; -1: unbounded);
   * 0 (a zero-initialized struct): no window. */
  int32_t sliding_window;
  int32_t window_left, window_right;
  /* Learnable attention sinks (ForwardOptions::sink_logits): device fp32 [heads_q], one logit per
   * query head joining each row's softmax denominator, in the units of the scaled scores; the LSE
   * includes it. NULL (a zero-initialized struct): no sink. */
  const float* sink_logits;
  /* ALiBi (ForwardOptions::alibi_slopes): device fp32 [heads_q]; the scaled score of query row i
   * and key j gets -slope[head] * |i + seqlen_k - seqlen_q - j| added. NULL: none. */
  const float* alibi_slopes;
  /* StreamingLLM sink tokens (ForwardOptions::sink_tokens): the first sink_tokens keys stay
   * visible beside the window band; needs sliding_window with window_left >= 0. 0: none. On
   * 64-bit targets 4 bytes of padding follow (user_functions is pointer-aligned): the place of
   * a next int32 field. */
  int32_t sink_tokens;
  /* User functions (ForwardOptions::user_functions) compiled into the kernel; the handle must
   * live through the call. NULL: none. */
  const flashjit_user_functions* user_functions;
  /* Read-only device pointers the user functions see as args.ptr[i]; all NULL without them. */
  const void* user_args[FLASHJIT_MAX_USER_ARGS];
  /* A block mask made for this forward's arguments (ForwardOptions::block_mask); NULL: none. */
  const flashjit_block_mask* block_mask;
} flashjit_forward_options;

/* The keys and values of a forward (Engine::forward's KVCache): dense k/v [batch, seqlen_k,
 * heads_kv, head_dim], or with page_table set, pages [num_pages, page_size, heads_kv, head_dim]
 * (NHD; HND through strides) read through page_table [batch, page_table_stride] int32 on the
 * device, pages_per_seq columns used. seqused_k: NULL or [batch] int32 on the device. */
typedef struct flashjit_kv_cache {
  flashjit_tensor k, v;
  const int32_t* page_table;
  int64_t pages_per_seq;
  int64_t page_table_stride; /* 0: pages_per_seq */
  const int32_t* seqused_k;
} flashjit_kv_cache;

typedef struct flashjit_engine flashjit_engine;

FLASHJIT_API const char* flashjit_version(void);
/* The NVRTC this process compiles with, e.g. "13.0". */
FLASHJIT_API const char* flashjit_nvrtc_version(void);
/* The CUDA driver's version (e.g. 13000) in *version; FLASHJIT_NO_DRIVER without one. */
FLASHJIT_API flashjit_status flashjit_driver_version(int32_t* version);
/* The message of the last failed call on this thread ("" if none). */
FLASHJIT_API const char* flashjit_last_error(void);

/* Number of kernel families built into this library, fastest first. */
FLASHJIT_API int32_t flashjit_family_count(void);
/* The name of family `index` (e.g. "wgmma"), or NULL when index is out of range. */
FLASHJIT_API const char* flashjit_family_name(int32_t index);
/* 1 when family `index` computes attention (a flashjit_forward_options.family), 0 for the merge
 * kernel or an index out of range. */
FLASHJIT_API int32_t flashjit_family_is_attention(int32_t index);
/* 1 when family `index` is one of flashjit_backward's kernels (dK/dV, the deterministic mode's
 * dQ, or the small passes before and after them), 0 for the others or an index out of range.
 * flashjit_backward_options.family names one of its dK/dV families. */
FLASHJIT_API int32_t flashjit_family_is_backward(int32_t index);

/* cache_dir: NULL for the default location order. */
FLASHJIT_API flashjit_status flashjit_engine_create(int device, const char* cache_dir,
                                                    flashjit_engine** engine);
FLASHJIT_API void flashjit_engine_destroy(flashjit_engine* engine);
/* on != 0: a forward whose kernel is not compiled yet runs a compiled stand-in for the same
 * problem while the kernel compiles in the background (Engine::set_never_block); 0: waits. */
FLASHJIT_API flashjit_status flashjit_engine_set_never_block(flashjit_engine* engine, int32_t on);
/* From now on, appends each variant the engine runs for the first time to the manifest file
 * (what FLASHJIT_RECORD=file does); `flashjit precompile --manifest file` builds them. */
FLASHJIT_API flashjit_status flashjit_engine_record(flashjit_engine* engine,
                                                    const char* manifest_path);
/* stream: a CUstream / cudaStream_t, or NULL for the legacy default stream. */
FLASHJIT_API flashjit_status flashjit_forward(flashjit_engine* engine, const flashjit_tensor* q,
                                              const flashjit_tensor* k, const flashjit_tensor* v,
                                              const flashjit_tensor* out,
                                              const flashjit_forward_options* options,
                                              void* stream);
/* A variable-length batch (Engine::forward's VarlenBatch): q/out packed [1, total_q, heads_q,
 * head_dim], a dense cache packed [1, total_k, heads_kv, head_dim] with cu_seqlens_k (NULL for a
 * paged one); cu_seqlens_* int32 [batch + 1] on the device; max_seqlen_* bound every length. The
 * LSE is then [heads_q, total_q]. */
typedef struct flashjit_varlen {
  const int32_t* cu_seqlens_q;
  const int32_t* cu_seqlens_k;
  int32_t batch;
  int32_t max_seqlen_q;
  int32_t max_seqlen_k;
} flashjit_varlen;

/* forward over a flashjit_kv_cache (dense or paged, with optional seqused_k). */
FLASHJIT_API flashjit_status flashjit_forward_kv(flashjit_engine* engine,
                                                 const flashjit_tensor* q,
                                                 const flashjit_kv_cache* kv,
                                                 const flashjit_tensor* out,
                                                 const flashjit_forward_options* options,
                                                 void* stream);
/* forward over a variable-length batch. */
FLASHJIT_API flashjit_status flashjit_forward_varlen(flashjit_engine* engine,
                                                     const flashjit_tensor* q,
                                                     const flashjit_kv_cache* kv,
                                                     const flashjit_tensor* out,
                                                     const flashjit_varlen* varlen,
                                                     const flashjit_forward_options* options,
                                                     void* stream);
/* Bytes of workspace flashjit_forward_kv needs for these arguments (0: it does not split), and
 * (num_splits may be NULL) how many splits it uses. */
FLASHJIT_API flashjit_status flashjit_workspace_bytes(flashjit_engine* engine,
                                                      const flashjit_tensor* q,
                                                      const flashjit_kv_cache* kv,
                                                      const flashjit_tensor* out,
                                                      const flashjit_forward_options* options,
                                                      uint64_t* bytes, int32_t* num_splits);
/* The same for flashjit_forward_varlen. */
FLASHJIT_API flashjit_status flashjit_workspace_bytes_varlen(
    flashjit_engine* engine, const flashjit_tensor* q, const flashjit_kv_cache* kv,
    const flashjit_tensor* out, const flashjit_varlen* varlen,
    const flashjit_forward_options* options, uint64_t* bytes);
/* Engine::merge_attention_states: out = merge of (out_a, lse_a) and (out_b, lse_b); lse_* fp32
 * [batch, heads, seqlen] contiguous; lse_out may be NULL; out may alias out_a or out_b. */
FLASHJIT_API flashjit_status flashjit_merge_attention_states(
    flashjit_engine* engine, const flashjit_tensor* out_a, const float* lse_a,
    const flashjit_tensor* out_b, const float* lse_b, const flashjit_tensor* out, float* lse_out,
    void* stream);
/* flashjit_select_variant for a flashjit_kv_cache. */
FLASHJIT_API flashjit_status flashjit_select_variant_kv(flashjit_engine* engine,
                                                        const flashjit_tensor* q,
                                                        const flashjit_kv_cache* kv,
                                                        const flashjit_tensor* out,
                                                        const flashjit_forward_options* options,
                                                        char* buf, int32_t buf_size);
/* Writes the canonical name of the variant forward would run into buf (NUL-terminated). */
FLASHJIT_API flashjit_status
flashjit_select_variant(flashjit_engine* engine, const flashjit_tensor* q, const flashjit_tensor* k,
                        const flashjit_tensor* v, const flashjit_tensor* out,
                        const flashjit_forward_options* options, char* buf, int32_t buf_size);

/* flashjit_backward's options (flashjit::BackwardOptions): those of the forward whose gradients
 * it computes, and how. A zero-initialized struct, or NULL, is the default: 1/sqrt(head_dim), no
 * mask, dQ through atomics, the dispatcher's kernels and tiles, the engine's own workspace.
 * Fields are only ever appended. The int32 fields come first, so no padding lies between the
 * fields on 32- or 64-bit targets (only after the last, up to the pointers' alignment). */
typedef struct flashjit_backward_options {
  float softmax_scale; /* the forward's; <= 0: 1/sqrt(head_dim) */
  int32_t causal;      /* the forward's causal mask (bottom-right aligned) */
  /* Nonzero: bitwise repeatable gradients. dQ then comes from a kernel of its own that sums the
   * key tiles of each query tile in a fixed order (about 1.4x the work), instead of fp32 atomic
   * adds, whose order varies from run to run. dK and dV never use atomics. On sm_90a the
   * default up to head_dim 128 (bwd_wgmma_fused) adds dQ up in the dK/dV kernel; with
   * deterministic, at d256 or with the bwd_wgmma family dQ comes from bwd_wgmma_dq. */
  int32_t deterministic;
  /* All three 0: the family's tile table. Else a forced dK/dV tile shape (tile_m query rows per
   * step, tile_n keys per CTA, stages); one the family cannot build fails with
   * FLASHJIT_INVALID_ARGUMENT. */
  int32_t tile_m, tile_n, stages;
  /* NULL or "": the dispatcher's choice; else a dK/dV family's flashjit_family_name() (one with
   * flashjit_family_is_backward). */
  const char* family;
  /* Optional scratch of at least flashjit_backward_workspace_bytes() bytes, 256-byte aligned,
   * used in stream order. NULL: the engine's own for the stream, allocated on the first call that
   * needs it (run a shape once before capturing it in a CUDA graph, or pass one). */
  void* workspace;
  uint64_t workspace_bytes;
  /* The forward's score variants, as in flashjit_forward_options (BackwardOptions: same values,
   * same checks; a zero-initialized struct has none). sink_logits: the forward's learnable sinks
   * (its LSE holds them); d_sink_logits, device fp32 [heads_q] or NULL, receives their gradient
   * (needs sink_logits). The pointers come first, so no padding lies between the fields. */
  const float* alibi_slopes;
  const float* sink_logits;
  float* d_sink_logits;
  /* The forward's user functions and user_args (BackwardOptions::user_functions): the backward
   * recomputes the probabilities with them; a score_mod needs its score_mod_grad
   * (FLASHJIT_INVALID_ARGUMENT otherwise). NULL: none. */
  const flashjit_user_functions* user_functions;
  const void* user_args[FLASHJIT_MAX_USER_ARGS];
  float softcap;
  int32_t sliding_window; /* nonzero applies window_left / window_right */
  int32_t window_left, window_right;
  int32_t sink_tokens;
  /* A block mask made by flashjit_backward_block_mask_create* for this backward's arguments
   * (BackwardOptions::block_mask): tiles the mask_mod hides wholly are skipped; NULL: none. */
  const flashjit_block_mask* block_mask;
} flashjit_backward_options;

/* Gradients of flashjit_forward(q, k, v, out) (Engine::backward): given dout = dL/dout, writes
 * dq, dk and dv; with GQA/MQA dk and dv are summed over the query heads of each group. lse: the
 * forward's fp32 [batch, heads_q, seqlen_q] (flashjit_forward_options.lse), natural log. q, out,
 * dout and dq have q's shape, k, v, dk and dv k's; one dtype for all; any strides forward takes.
 * options: NULL or one with the forward's softmax_scale and causal. The tensors are checked
 * before the engine, each in argument order, so the first null one is named. Invalid input
 * launches nothing. stream: as flashjit_forward. */
FLASHJIT_API flashjit_status flashjit_backward(
    flashjit_engine* engine, const flashjit_tensor* q, const flashjit_tensor* k,
    const flashjit_tensor* v, const flashjit_tensor* out, const flashjit_tensor* dout,
    const float* lse, const flashjit_tensor* dq, const flashjit_tensor* dk,
    const flashjit_tensor* dv, const flashjit_backward_options* options, void* stream);
/* Bytes of workspace flashjit_backward needs for these arguments, in *bytes. */
FLASHJIT_API flashjit_status flashjit_backward_workspace_bytes(
    flashjit_engine* engine, const flashjit_tensor* q, const flashjit_tensor* k,
    const flashjit_tensor* v, const flashjit_backward_options* options, uint64_t* bytes);
/* Writes the canonical name of the dK/dV variant flashjit_backward would run into buf
 * (NUL-terminated), e.g. "bwd_mma.sm90a.bf16.d128.m64n64s2.causal". */
FLASHJIT_API flashjit_status flashjit_select_backward_variant(
    flashjit_engine* engine, const flashjit_tensor* q, const flashjit_tensor* k,
    const flashjit_tensor* v, const flashjit_backward_options* options, char* buf,
    int32_t buf_size);
/* Gradients of flashjit_forward_varlen over a dense packed cache (Engine::backward with a
 * VarlenBatch): q, out, dout, dq [1, total_q, heads_q, head_dim]; k, v, dk, dv [1, total_k,
 * heads_kv, head_dim]; lse the forward's [heads_q, total_q]; varlen->cu_seqlens_k is required.
 * Each sequence is its own problem; rows past the last sequence are not written. */
FLASHJIT_API flashjit_status flashjit_backward_varlen(
    flashjit_engine* engine, const flashjit_tensor* q, const flashjit_tensor* k,
    const flashjit_tensor* v, const flashjit_tensor* out, const flashjit_tensor* dout,
    const float* lse, const flashjit_tensor* dq, const flashjit_tensor* dk,
    const flashjit_tensor* dv, const flashjit_varlen* varlen,
    const flashjit_backward_options* options, void* stream);
/* The same as flashjit_backward_workspace_bytes / flashjit_select_backward_variant, for
 * flashjit_backward_varlen. */
FLASHJIT_API flashjit_status flashjit_backward_workspace_bytes_varlen(
    flashjit_engine* engine, const flashjit_tensor* q, const flashjit_tensor* k,
    const flashjit_tensor* v, const flashjit_varlen* varlen,
    const flashjit_backward_options* options, uint64_t* bytes);
FLASHJIT_API flashjit_status flashjit_select_backward_variant_varlen(
    flashjit_engine* engine, const flashjit_tensor* q, const flashjit_tensor* k,
    const flashjit_tensor* v, const flashjit_varlen* varlen,
    const flashjit_backward_options* options, char* buf, int32_t buf_size);

/* User functions from source text: score_mod and mask_mod, each NULL or "" when absent (not both),
 * and score_mod_grad, the score_mod's derivative the backward needs (NULL or "": none; it needs a
 * score_mod). No GPU needed and nothing compiled here: a source NVRTC rejects fails the first
 * forward (or precompile) of a variant that uses it with FLASHJIT_COMPILE_FAILED, its log naming
 * the lines as "score_mod(LINE)" / "mask_mod(LINE)" / "score_mod_grad(LINE)". *out is the new
 * handle (NULL on failure). */
FLASHJIT_API flashjit_status flashjit_user_functions_create(const char* score_mod,
                                                            const char* mask_mod,
                                                            const char* score_mod_grad,
                                                            flashjit_user_functions** out);
/* The same with each source read from a file (NULL or "": absent); a file that cannot be read is
 * FLASHJIT_INVALID_ARGUMENT naming it. */
FLASHJIT_API flashjit_status flashjit_user_functions_from_files(const char* score_mod_file,
                                                                const char* mask_mod_file,
                                                                const char* score_mod_grad_file,
                                                                flashjit_user_functions** out);
/* The 32 hex digits that name them in variant names (".user<hash>"), valid while the handle is;
 * NULL for a NULL handle. */
FLASHJIT_API const char* flashjit_user_functions_hash(const flashjit_user_functions* functions);
FLASHJIT_API void flashjit_user_functions_destroy(flashjit_user_functions* functions);

/* Engine::create_block_mask: the block mask of options->user_functions' mask_mod for a forward
 * with these arguments (the same q, k, v, out and options otherwise; options->block_mask is
 * ignored), built on `stream` asynchronously; it allocates device memory, so make it before a
 * CUDA graph capture. same_for_all_heads / same_for_all_batches nonzero: the mask_mod depends on
 * neither, one map serves every head / sequence. Destroy it before its engine. */
FLASHJIT_API flashjit_status flashjit_block_mask_create(
    flashjit_engine* engine, const flashjit_tensor* q, const flashjit_tensor* k,
    const flashjit_tensor* v, const flashjit_tensor* out, const flashjit_forward_options* options,
    int32_t same_for_all_heads, int32_t same_for_all_batches, void* stream,
    flashjit_block_mask** mask);
/* The same for flashjit_forward_kv. */
FLASHJIT_API flashjit_status flashjit_block_mask_create_kv(
    flashjit_engine* engine, const flashjit_tensor* q, const flashjit_kv_cache* kv,
    const flashjit_tensor* out, const flashjit_forward_options* options,
    int32_t same_for_all_heads, int32_t same_for_all_batches, void* stream,
    flashjit_block_mask** mask);
/* The same for flashjit_forward_varlen. */
FLASHJIT_API flashjit_status flashjit_block_mask_create_varlen(
    flashjit_engine* engine, const flashjit_tensor* q, const flashjit_kv_cache* kv,
    const flashjit_tensor* out, const flashjit_varlen* varlen,
    const flashjit_forward_options* options, int32_t same_for_all_heads,
    int32_t same_for_all_batches, void* stream, flashjit_block_mask** mask);
/* Engine::create_backward_block_mask: the block masks of options->user_functions' mask_mod for
 * a flashjit_backward with these q, k, v and options (its family, tiles and deterministic
 * included; options->block_mask is ignored), for flashjit_backward_options.block_mask. As
 * flashjit_block_mask_create otherwise. */
FLASHJIT_API flashjit_status flashjit_backward_block_mask_create(
    flashjit_engine* engine, const flashjit_tensor* q, const flashjit_tensor* k,
    const flashjit_tensor* v, const flashjit_backward_options* options,
    int32_t same_for_all_heads, int32_t same_for_all_batches, void* stream,
    flashjit_block_mask** mask);
/* The same for flashjit_backward_varlen. */
FLASHJIT_API flashjit_status flashjit_backward_block_mask_create_varlen(
    flashjit_engine* engine, const flashjit_tensor* q, const flashjit_tensor* k,
    const flashjit_tensor* v, const flashjit_varlen* varlen,
    const flashjit_backward_options* options, int32_t same_for_all_heads,
    int32_t same_for_all_batches, void* stream, flashjit_block_mask** mask);
FLASHJIT_API void flashjit_block_mask_destroy(flashjit_block_mask* mask);
/* BlockMask::counts: key tiles visited, partly masked (partial) and not masked (full), and those
 * the causal / window masks leave (total), summed over the map; waits for the map to be built.
 * Any output pointer may be NULL. */
FLASHJIT_API flashjit_status flashjit_block_mask_counts(const flashjit_block_mask* mask,
                                                        int64_t* partial, int64_t* full,
                                                        int64_t* total);
/* The canonical name of the attention variant the mask was built for (what the forward given it
 * runs) into buf (NUL-terminated). */
FLASHJIT_API flashjit_status flashjit_block_mask_variant(const flashjit_block_mask* mask,
                                                         char* buf, int32_t buf_size);

/* Compiles the named variants into the cache; no GPU needed. A name with ".user<hash>" needs
 * user functions of that hash made in this process (flashjit_user_functions_create). */
FLASHJIT_API flashjit_status flashjit_precompile(const char* cache_dir,
                                                 const char* const* variant_names, int32_t count);

#ifdef __cplusplus
}
#endif

#endif

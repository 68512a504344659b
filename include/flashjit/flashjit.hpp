// flashjit: fused multi-head attention forward, specialized and compiled at run time with NVRTC.
//
// Flow: Engine::forward validates its arguments, picks a Variant for the problem and the GPU,
// fetches the kernel (memory -> disk cache -> NVRTC) and launches it on the caller's stream.
// Everything except Engine works without a GPU or a CUDA driver (compile, cache, list).
#pragma once

#include <array>
#include <cstddef>
#include <cstdint>
#include <filesystem>
#include <functional>
#include <memory>
#include <optional>
#include <stdexcept>
#include <string>
#include <string_view>
#include <vector>

#include "flashjit/export.h"

struct CUstream_st;  // == CUstream == cudaStream_t, so callers need no CUDA header
struct CUctx_st;     // == CUcontext
struct CUevent_st;   // == CUevent

namespace flashjit {

FLASHJIT_API std::string_view version();

// The library's log level: "trace", "debug", "info", "warn" (default), "error" or "off". Overrides
// FLASHJIT_LOG_LEVEL. Throws Error(invalid_argument) for another name.
FLASHJIT_API void set_log_level(std::string_view level);

enum class ErrorCode {
  invalid_argument,  // bad input from the caller; nothing was launched or written
  no_driver,         // libcuda could not be loaded
  no_device,         // the driver sees no (such) GPU
  compile_failed,    // NVRTC rejected a kernel; message carries the log
  cuda_error,        // a driver call failed
  cache_error,       // the disk cache could not be used for a requested operation
  unsupported,       // valid input that no kernel family handles
};

// Every failure is an Error whose message names what was wrong and what was expected.
class FLASHJIT_API Error : public std::runtime_error {
 public:
  Error(ErrorCode code, const std::string& message) : std::runtime_error(message), code_(code) {}
  ErrorCode code() const { return code_; }

 private:
  ErrorCode code_;
};

enum class DType { bf16, fp16 };
FLASHJIT_API std::string_view to_string(DType dtype);

// User functions (docs/variants.md, "User functions"): CUDA C source that NVRTC compiles into the
// attention kernel, FlexAttention's score_mod and mask_mod for C and C++ callers.
//   score_mod's source defines
//     __device__ float score_mod(float score, int batch, int head, int q_idx, int kv_idx,
//                                const flashjit::UserArgs& args);
//   mask_mod's source defines
//     __device__ bool mask_mod(int batch, int head, int q_idx, int kv_idx,
//                              const flashjit::UserArgs& args);
// `score` is softmax_scale · q·k after soft-capping and ALiBi, in natural-log units; what
// score_mod returns goes on to the masks and the softmax. mask_mod returns false to hide key
// kv_idx from query q_idx (on top of causal / window masks). batch is the sequence, head the query
// head; q_idx and kv_idx are positions in that sequence (0 <= q_idx < its seqlen_q, 0 <= kv_idx <
// its seqlen_k: functions are never called outside them). args.ptr[i] is
// ForwardOptions::user_args[i], read-only device memory. The functions may be called any number
// of times per (q_idx, kv_idx), so they must be pure.
//   For the backward, a score_mod needs its derivative; score_mod_grad's source defines
//     __device__ float score_mod_grad(float score, int batch, int head, int q_idx, int kv_idx,
//                                     const flashjit::UserArgs& args);
// returning d score_mod(score, ...) / d score at the same arguments (1 for a bias added to the
// score). It sits beside score_mod's code, so it may call score_mod's helpers. The user_args are
// constants to the backward: no gradient flows into what they point at.
constexpr int kMaxUserArgs = 8;

class FLASHJIT_API UserFunctions {
 public:
  // Either source may be empty (that function is absent), not both: Error(invalid_argument).
  // Nothing is compiled here; a source NVRTC rejects fails the first compile of a variant that
  // uses it with Error(compile_failed), whose log names the user's lines as "score_mod(LINE)" or
  // "mask_mod(LINE)". Every UserFunctions made in a process stays known to it by hash, so
  // KernelCache::compile can build a Variant that names it.
  // score_mod_grad (optional, needs a score_mod: Error(invalid_argument)) is what the backward
  // of a score_mod needs; without it a backward with a score_mod is refused.
  UserFunctions(std::string score_mod, std::string mask_mod, std::string score_mod_grad = {});
  // Reads the sources from files (an empty path: that function is absent); Error(invalid_argument)
  // naming a file that cannot be read.
  static UserFunctions from_files(const std::filesystem::path& score_mod_file,
                                  const std::filesystem::path& mask_mod_file,
                                  const std::filesystem::path& score_mod_grad_file = {});

  const std::string& score_mod() const { return score_mod_; }
  const std::string& mask_mod() const { return mask_mod_; }
  const std::string& score_mod_grad() const { return score_mod_grad_; }
  bool has_score_mod() const { return !score_mod_.empty(); }
  bool has_mask_mod() const { return !mask_mod_.empty(); }
  bool has_score_mod_grad() const { return !score_mod_grad_.empty(); }
  // Whether a backward can run them: no score_mod, or one with its score_mod_grad.
  bool differentiable() const { return !has_score_mod() || has_score_mod_grad(); }
  // 32 hex digits of a 128-bit hash of the sources: Variant::user_functions, and through the
  // variant's name part of the cache key. Equal sources have equal hashes in every process.
  const std::string& hash() const { return hash_; }

 private:
  std::string score_mod_, mask_mod_, score_mod_grad_, hash_;
};

// A kernel family is one kernel template; a Variant fixes all of its compile-time parameters.
// families() lists those built into this library, fastest first (the dispatcher's preference):
// today decode (split-KV decode with GQA packing over dense or paged caches, sm_80 on), wgmma
// (Hopper, sm_90a: TMA + wgmma + warp specialization), mma (tensor cores through mma.sync,
// FlashAttention-2 class, sm_80 on), simt (scalar fp32, the first correct kernel), and merge
// (combines split-KV partials and merge_attention_states: not an attention family, so
// ForwardOptions::family refuses it).
struct FamilyInfo {
  std::string name;                // the first field of its variant names, e.g. "wgmma"
  bool attention = true;           // false for merge: forward never runs it
  // A kernel of Engine::backward (dK/dV, the deterministic dQ, or the small passes before and
  // after them); forward never runs it.
  bool backward = false;
  std::string summary;             // one line: what the kernel is
  std::vector<int> head_dims;      // head dims it has kernels for
  std::vector<std::string> archs;  // the known archs it runs on
  bool softcap = false;            // builds soft-capped variants (ForwardOptions::softcap)
  bool window = false;             // builds sliding-window variants (ForwardOptions::window_*)
  bool sink = false;               // builds attention-sink variants (ForwardOptions::sink_logits)
  bool alibi = false;              // builds ALiBi variants (ForwardOptions::alibi_slopes)
  bool user_functions = false;     // compiles user functions in (ForwardOptions::user_functions)
  bool block_mask = false;         // skips tiles by a BlockMask (ForwardOptions::block_mask)
  bool paged_kv = false;           // reads paged KV caches (KVCache::paged)
  bool varlen = false;             // takes VarlenBatch and KVCache::seqused_k
  bool split_kv = false;           // splits keys across CTAs (ForwardOptions::num_splits)
};
FLASHJIT_API const std::vector<FamilyInfo>& families();

// Everything one compiled binary is specialized on. Its canonical name is readable, complete and
// parses back, e.g. "mma.sm90.bf16.d128.m128n64s2.causal" or "decode.sm90a.bf16.d128.m16n64s3.paged":
// feature suffixes (causal, paged, varlen, softcap, window, sink, alibi, user<hash>) follow the
// tiles in that order, present only when set.
struct FLASHJIT_API Variant {
  std::string family = "simt";  // a name from families()
  std::string arch;  // NVRTC target: sm_80, sm_86, sm_89, sm_90, sm_90a, sm_100a, sm_120, ...
  DType dtype = DType::bf16;
  int head_dim = 128;
  int tile_m = 64;
  int tile_n = 64;
  int stages = 1;
  bool causal = false;
  bool paged = false;  // K/V read through a page table (KVCache::paged)
  // Per-sequence lengths (a VarlenBatch or KVCache::seqused_k) compiled in: families that build
  // such variants (wgmma) keep dense batches on kernels without that code. The decode families
  // take lengths at run time and have none.
  bool varlen = false;
  // Logit soft-capping compiled in (ForwardOptions::softcap > 0): scores become
  // softcap * tanh(scale * q·k / softcap) before masking and softmax.
  bool softcap = false;
  // A sliding window compiled in (ForwardOptions::window_left / window_right): each query row sees
  // a band of keys, and key tiles wholly outside it are not visited.
  bool window = false;
  // Learnable attention sinks compiled in (ForwardOptions::sink_logits): one more logit per query
  // head in each row's softmax denominator.
  bool sink = false;
  // ALiBi compiled in (ForwardOptions::alibi_slopes): a linear bias by distance on each score.
  bool alibi = false;
  // User functions compiled in (ForwardOptions::user_functions): UserFunctions::hash(), 32
  // lowercase hex digits, or empty for none. The name carries it as ".user<hash>"; compiling
  // such a variant needs a UserFunctions of that hash made in this process.
  std::string user_functions;

  std::string name() const;
  // Throws Error(invalid_argument) naming the field that is wrong, or for a variant that the
  // family cannot build (the check forward and precompile share).
  static Variant parse(std::string_view name);
  bool operator==(const Variant&) const = default;
};

// The variants `precompile` builds for an arch when none are named: every family that runs on it,
// bf16 and fp16, every supported head dim, causal and not, with the dispatcher's tile choice.
FLASHJIT_API std::vector<Variant> default_variants(std::string_view arch);
// Variant manifests (docs/cache.md): one canonical variant name per line, '#' comments. What a
// process recorded (FLASHJIT_RECORD, Engine::record_variants) is what `flashjit precompile
// --manifest` builds for a fleet. read_variant_manifest throws Error(invalid_argument) naming the
// file and line of a bad name; write_variant_manifest replaces the file atomically.
FLASHJIT_API std::vector<Variant> read_variant_manifest(const std::filesystem::path& file);
FLASHJIT_API void write_variant_manifest(const std::filesystem::path& file,
                                         const std::vector<Variant>& variants);

// Head dims the engine accepts: those of every family, ascending.
FLASHJIT_API std::vector<int> supported_head_dims();
// Canonical arch from user spellings: "sm_90a", "sm_90", "90", "9.0", "h100", "h200", "a100", ...
// Throws Error(invalid_argument) listing the valid spellings.
FLASHJIT_API std::string normalize_arch(std::string_view arch);
// Archs the linked NVRTC can generate code for (sm_XX, plus the 'a' forms we use).
FLASHJIT_API std::vector<std::string> nvrtc_archs();
FLASHJIT_API std::string nvrtc_version();

// Whether a cache entry is what this library would build now.
enum class EntryState {
  current,  // its key matches this library's sources, options and versions: it is served
  stale,    // built from other sources, options or versions (or a family not built in): never
            // served, and `remove_stale` deletes it
  unknown,  // the key cannot be computed (kernel sources missing, e.g. FLASHJIT_KERNELS_DIR
            // names no directory): neither served by this process nor deleted as stale
};
FLASHJIT_API std::string_view to_string(EntryState state);  // "current", "stale", "unknown"

// One binary in the disk cache (what `flashjit list` prints).
struct CacheEntry {
  Variant variant;
  std::string key;  // 16 hex digits of the content key
  std::filesystem::path cubin_path;
  std::filesystem::path layer;  // the cache directory it is in
  bool read_only = false;       // in a read-only layer: served, never written or pruned
  std::size_t cubin_bytes = 0;
  int registers = 0;
  int spill_bytes = 0;
  int static_shared_bytes = 0;
  int dynamic_shared_bytes = 0;
  double compile_ms = 0;
  std::string nvrtc_version;
  std::string flashjit_version;
  std::string created;    // ISO 8601 UTC
  std::string last_used;  // ISO 8601 UTC, what prune orders by
  EntryState state = EntryState::current;
};

struct CompileOutcome {
  Variant variant;
  bool ok = false;
  bool was_cached = false;  // served from memory or disk, no NVRTC run
  double milliseconds = 0;  // wall time of this request
  std::string error;        // when !ok: the message, including the NVRTC log
  std::optional<CacheEntry> entry;
};

// Where compiled kernels are kept (docs/cache.md): one writable directory, then read-only layers.
struct CacheOptions {
  // The writable directory. Empty: the first entry of $FLASHJIT_CACHE_PATH, else
  // $FLASHJIT_CACHE_DIR, $XDG_CACHE_HOME/flashjit, ~/.cache/flashjit (home from the password
  // database when HOME is unset); never a shared temp directory.
  std::optional<std::filesystem::path> dir;
  // Read-only layers searched after it (e.g. a `flashjit precompile --out` bundle in an image),
  // before the other entries of $FLASHJIT_CACHE_PATH. Served (hash-verified), never written.
  std::vector<std::filesystem::path> read_only_dirs{};
};

// One directory of the cache, in search order.
struct CacheLayer {
  std::filesystem::path dir;
  bool writable = false;
};

// The compiled-kernel store: NVRTC plus the on-disk cache. Thread-safe; shareable by Engines.
class FLASHJIT_API KernelCache {
 public:
  explicit KernelCache(CacheOptions options = {});
  ~KernelCache();
  KernelCache(const KernelCache&) = delete;
  KernelCache& operator=(const KernelCache&) = delete;

  // The writable directory in use, or empty when there is none (new kernels are then kept in
  // memory only; read-only layers are still served).
  std::optional<std::filesystem::path> directory() const;
  // Why there is no writable directory (naming it and where it came from); empty when there is.
  std::string why_not_persistent() const;
  // Every layer in use, in search order (the writable one first when there is one).
  std::vector<CacheLayer> layers() const;
  // Compiles (or finds) each variant, `jobs` at a time (0: hardware threads). Never throws for a
  // failing variant; its outcome carries the error. `on_done` (optional) is called once per
  // variant as it finishes, from the worker threads, one call at a time.
  std::vector<CompileOutcome> precompile(
      const std::vector<Variant>& variants, int jobs = 0,
      const std::function<void(const CompileOutcome&)>& on_done = {});
  CompileOutcome compile(const Variant& variant);
  std::vector<CacheEntry> list(std::optional<std::string> arch = {}) const;
  // Removes entries of the writable layer (of one arch, or all). Returns the number removed.
  std::size_t clear(std::optional<std::string> arch = {});
  // Removes the writable layer's least recently used entries until its size is at most max_bytes.
  std::size_t prune(std::uint64_t max_bytes);
  // Removes the writable layer's stale entries (EntryState::stale; never unknown ones). Returns
  // the number.
  std::size_t remove_stale();

 private:
  friend class Engine;  // fetches kernels through the same store
  struct Impl;
  std::unique_ptr<Impl> impl_;
};

// A strided 4-D view [batch, seqlen, heads, head_dim] of device memory; strides in elements.
// head_dim must have stride 1; other strides are free, so BSHD and BHSD both work.
struct FLASHJIT_API TensorView {
  void* data = nullptr;
  DType dtype = DType::bf16;
  std::array<std::int64_t, 4> shape{};
  std::array<std::int64_t, 4> stride{};

  // Contiguous [b, s, h, d] (BSHD) and the same shape stored as [b, h, s, d] (BHSD).
  static TensorView bshd(void* data, DType dtype, std::int64_t b, std::int64_t s, std::int64_t h,
                         std::int64_t d);
  static TensorView bhsd(void* data, DType dtype, std::int64_t b, std::int64_t s, std::int64_t h,
                         std::int64_t d);
};

// The keys and values a forward reads: dense tensors, or a paged KV cache (vLLM / FlashInfer).
//  - dense: k, v are [batch, seqlen_k, heads_kv, head_dim] views, as in the three-tensor forward.
//  - paged: k, v are pages [num_pages, page_size, heads_kv, head_dim]; TensorView::bshd of those
//    sizes is the NHD page layout, TensorView::bhsd the HND one (any strides with a unit head_dim
//    stride work). Sequence b's key j lives in page page_table[b * page_table_stride + j /
//    page_size], row j % page_size. page_size: a multiple of 8.
// seqused_k (optional, both kinds): [batch] int32 on the device, the keys valid in each sequence
// (at most the cache's capacity: seqlen_k, or pages_per_seq * page_size); the causal mask aligns
// to it. Without it every sequence has the full capacity.
struct FLASHJIT_API KVCache {
  TensorView k, v;
  const std::int32_t* page_table = nullptr;  // set: paged
  std::int64_t pages_per_seq = 0;            // page table columns
  std::int64_t page_table_stride = 0;        // elements between page table rows (>= columns)
  const std::int32_t* seqused_k = nullptr;

  static KVCache dense(const TensorView& k, const TensorView& v,
                       const std::int32_t* seqused_k = nullptr);
  // page_table: [batch, pages_per_seq] int32 on the device, contiguous rows.
  static KVCache paged(const TensorView& k_pages, const TensorView& v_pages,
                       const std::int32_t* page_table, std::int64_t pages_per_seq,
                       const std::int32_t* seqused_k = nullptr);
  bool is_paged() const { return page_table != nullptr; }
};

// A batch of sequences of different lengths packed along the seqlen dimension (FlashAttention's
// varlen convention): q and out are [1, total_q, heads_q, head_dim] views, sequence b's queries
// rows [cu_seqlens_q[b], cu_seqlens_q[b + 1]); a dense KVCache is [1, total_k, heads_kv,
// head_dim] with cu_seqlens_k the same way; a paged one takes no cu_seqlens_k (lengths from
// seqused_k, else the page table's capacity). cu_seqlens_* are int32 [batch + 1] on the device,
// starting at 0 and non-decreasing (not checkable on the host: lengths are clamped to [0, max]);
// max_seqlen_* are host hints that must bound every length (lengths are clamped to them;
// max_seqlen_k is read for a dense cache only, a paged one is bounded by its capacity). Rows
// after cu_seqlens_q[batch] (padding) are neither read nor written. The LSE is [heads_q,
// total_q].
struct VarlenBatch {
  const std::int32_t* cu_seqlens_q = nullptr;
  const std::int32_t* cu_seqlens_k = nullptr;
  int batch = 0;
  int max_seqlen_q = 0;
  int max_seqlen_k = 0;
};

// A kernel's tile shape: query rows per tile, keys per tile, K/V pipeline depth.
struct TileConfig {
  int tile_m = 64, tile_n = 64, stages = 1;
  bool operator==(const TileConfig&) const = default;
};

class BlockMask;

struct ForwardOptions {
  std::optional<float> softmax_scale;  // default 1/sqrt(head_dim)
  // Causal mask aligned bottom-right like FlashAttention: query i sees key j iff
  // j <= i + seqlen_k - seqlen_q. Rows that see no key give output 0 and LSE -inf.
  bool causal = false;
  // Optional device buffer, fp32 [batch, heads_q, seqlen_q] contiguous; [heads_q, total_q] for a
  // VarlenBatch.
  float* lse = nullptr;
  // Force a family by name (tests, benchmarks), one of families(); default: the dispatcher's.
  std::optional<std::string> family;
  // Force a tile shape (tuning, benchmarks) on the chosen family; default: its tile table. A
  // shape the family cannot build or the GPU cannot fit throws Error(invalid_argument).
  std::optional<TileConfig> tiles;
  // Split-KV (the decode family, docs/serving.md): the keys of each sequence are split across this
  // many CTAs whose partial results are merged through their LSE. 0: the heuristic's choice
  // (problem size and SM count); otherwise 1 to 128.
  int num_splits = 0;
  // Scratch for split-KV partials, at least Engine::workspace_bytes() bytes, 256-byte aligned,
  // used in stream order. Null: the engine's own buffer for the stream, allocated on the first
  // call that needs it (so warm a shape up before capturing it in a CUDA graph, or pass one).
  void* workspace = nullptr;
  std::size_t workspace_bytes = 0;
  // Logit soft-capping (Gemma 2, Grok): > 0 turns each score s = softmax_scale * q·k into
  // softcap * tanh(s / softcap) before masking and softmax, in kernels built for it
  // (Variant::softcap); 0: off. The LSE is of the capped scores.
  float softcap = 0.f;
  // Sliding window (local attention, FlashAttention's convention; Mistral, Gemma 2/3, gpt-oss):
  // query row i sees keys [i + d - window_left, i + d + window_right], d = seqlen_k - seqlen_q
  // (bottom-right aligned, like causal); -1 leaves that side unbounded. With causal the right
  // side is the diagonal: window_right must be -1 or 0. Both -1: no window. Runs kernels built
  // for it (Variant::window), whose time scales with the window, not the sequence.
  int window_left = -1;
  int window_right = -1;
  // StreamingLLM's sink tokens: the first sink_tokens keys of each sequence stay visible to every
  // row besides its window band, never past the band's right side (the diagonal with causal): key
  // j is seen iff j <= i + d + window_right and (j >= i + d - window_left or j < sink_tokens).
  // Needs a bounded window_left (>= 0). A run-time parameter of the window kernels (no variant of
  // its own); 0: none.
  int sink_tokens = 0;
  // Learnable attention sinks (gpt-oss, FlashAttention 4's learnable_sink): device fp32
  // [heads_q], one logit per query head that joins each row's softmax denominator (it has no
  // value vector), in the units of the scaled scores (softmax_scale · q·k); the LSE includes it.
  // Rows that see no key get output 0 and LSE = the sink. Runs kernels built for it
  // (Variant::sink); null: no sink.
  const float* sink_logits = nullptr;
  // ALiBi (Press et al.; FlashAttention's alibi_slopes, bottom-right aligned): device fp32
  // [heads_q]; the scaled score of query row i and key j gets -slope[head] * |i + d - j| added,
  // d = seqlen_k - seqlen_q, in natural-log units, after softmax_scale and soft-capping and
  // before masking. The LSE includes this whole bias (FlashAttention-2's causal kernels add
  // slope * j only: the same softmax, but their LSE is higher by slope * (i + d)). Runs kernels
  // built for it (Variant::alibi); null: none.
  const float* alibi_slopes = nullptr;
  // User functions (UserFunctions: score_mod, mask_mod) compiled into the kernel; they run in
  // kernels built for them (Variant::user_functions, by their hash). The object must live through
  // the call; null: none.
  const UserFunctions* user_functions = nullptr;
  // Read-only device pointers the user functions see as args.ptr[0..kMaxUserArgs).
  std::array<const void*, kMaxUserArgs> user_args{};
  // Key tiles to skip, made by Engine::create_block_mask for the same arguments (their shapes,
  // options and user functions): tiles its mask_mod hides wholly are not visited, and tiles it
  // hides nowhere skip the per-score mask. A forward checks what it can (shapes, tiles, masks) and
  // throws Error(invalid_argument) otherwise; the contents of user_args it cannot check, so
  // rebuild the mask when they change. Null: every tile the causal / window masks leave is
  // visited and masked score by score.
  const BlockMask* block_mask = nullptr;
};

// Engine::backward's options: those of the forward whose gradients it computes, and how.
struct BackwardOptions {
  std::optional<float> softmax_scale;  // the forward's; default 1/sqrt(head_dim)
  bool causal = false;                 // the forward's causal mask (bottom-right aligned)
  // The forward's score variants, as in ForwardOptions (same values, same checks): the backward
  // recomputes its probabilities with them, in kernels built for them (Variant::softcap, window,
  // alibi). A soft-cap's gradient includes its 1 - tanh² factor; ALiBi slopes and sink logits are
  // constants to it (no gradient for the slopes).
  float softcap = 0.f;
  int window_left = -1;
  int window_right = -1;
  int sink_tokens = 0;
  const float* alibi_slopes = nullptr;
  // The forward's learnable sinks (device fp32 [heads_q]): its LSE holds them, so dq, dk and dv
  // need nothing more. d_sink_logits (device fp32 [heads_q], needs sink_logits) receives their
  // gradient, dL/dsink_h = -Σ over batch and rows of exp(sink_h - lse) · rowsum(dO ∘ O), summed
  // in a fixed order (bitwise repeatable); null: not computed. A backward with batch 0 launches
  // nothing and leaves it as it was.
  const float* sink_logits = nullptr;
  float* d_sink_logits = nullptr;
  // The forward's user functions and their arguments (ForwardOptions::user_functions,
  // user_args): the backward recomputes the probabilities with the score_mod and mask_mod, in
  // kernels built for them (.user<hash> variants), and takes the score_mod's derivative from
  // score_mod_grad (a score_mod without one is Error(invalid_argument)). No gradient flows into
  // the user_args.
  const UserFunctions* user_functions = nullptr;
  std::array<const void*, kMaxUserArgs> user_args{};
  // Tiles to skip, made by Engine::create_backward_block_mask for the same arguments (shapes,
  // options, user functions, deterministic, family, tiles; not a forward's create_block_mask):
  // the dK/dV kernel skips the query tiles the mask_mod hides wholly from each key tile, the dQ
  // kernel the key tiles it hides from each query tile, and tiles it hides nowhere skip the
  // per-score mask. The gradients are those without it (dK and dV bit for bit; dQ up to fp32
  // rounding where a dQ kernel visits the tiles in another order). Checked like the forward's
  // (Error(invalid_argument) naming what differs); the contents of user_args are not: rebuild
  // it when they change. Null: every tile causal and window leave, masked score by score.
  const BlockMask* block_mask = nullptr;
  // Bitwise repeatable gradients: dQ comes from a kernel of its own that owns each query tile
  // and sums its key tiles in a fixed order (about 1.4x the work), instead of the default's fp32
  // atomic adds from every key tile, whose order varies from run to run. dK and dV never use
  // atomics (each key tile, GQA group included, is summed by one CTA). On sm_90a the default up
  // to head_dim 128 is bwd_wgmma_fused (dQ added up by bulk reductions in the dK/dV kernel);
  // deterministic, d256 or with family "bwd_wgmma", dQ comes from bwd_wgmma_dq (repeatable in
  // both modes).
  bool deterministic = false;
  // Force the dK/dV family by name (tests, benchmarks), one of families() with backward set.
  std::optional<std::string> family;
  // Force its tile shape (tile_m query rows per step, tile_n keys per CTA, stages).
  std::optional<TileConfig> tiles;
  // Scratch (the dO·O row sums, the LSE in the kernels' units, a counter of the dK/dV tiles taken
  // and, where dQ is summed by atomics, the fp32 dQ accumulator): at least
  // Engine::backward_workspace_bytes() bytes, 256-byte aligned, used in stream order. Null: the
  // engine's own buffer for the stream, allocated on the first call that needs it (so run a shape
  // once before capturing it in a CUDA graph, or pass one).
  void* workspace = nullptr;
  std::size_t workspace_bytes = 0;
};

// Which key tiles each query tile of a problem must visit, found once by evaluating a
// UserFunctions' mask_mod (with the causal / window masks) over every score of the problem:
// per (batch, head, query tile), the key tiles that no mask touches, then those partly masked
// (docs/variants.md, "Block masks"). Made by Engine::create_block_mask for the kernel tiles the
// forward runs, or by Engine::create_backward_block_mask for a backward's kernels (per key tile
// and KV head, the query tiles of each query head of its group, for the dK/dV kernel; and the
// forward's kind at the dQ kernel's tiles where one runs); owns device memory on the engine's
// GPU.
struct BlockMaskOptions {
  // The mask_mod does not depend on the head (or the batch): one map serves every head (batch),
  // evaluated at head 0 (batch 0). Smaller, built faster.
  bool same_for_all_heads = false;
  bool same_for_all_batches = false;
};

namespace detail {
struct BlockMaskAccess;  // the library's own way in (src/api/block_mask.hpp)
}

class FLASHJIT_API BlockMask {
 public:
  BlockMask(BlockMask&&) noexcept;
  BlockMask& operator=(BlockMask&&) noexcept;
  ~BlockMask();

  // The attention variant it was built for (its tiles, masks and user functions): the forward
  // given this mask runs exactly it. A backward's: the dK/dV variant the backward runs.
  const Variant& variant() const;
  // Made by create_backward_block_mask (for BackwardOptions::block_mask), not create_block_mask.
  bool backward() const;
  int query_tiles() const;  // per sequence (of the longest, for a varlen batch)
  int key_tiles() const;
  std::size_t device_bytes() const;  // a backward's: both of its maps
  // Key tiles visited (partly masked, not masked) summed over the map; copies the map's counts to
  // the host and waits for them (for reports and tests, not the hot path). A backward's counts
  // its dK/dV kernel's (key tile, query head, query tile) steps; dq_counts() its dQ kernel's map
  // (zeros where no dQ kernel runs: the dK/dV kernel adds dQ up).
  struct Counts {
    long long partial = 0, full = 0, total = 0;  // total: tiles the causal / window masks leave
  };
  Counts counts() const;
  Counts dq_counts() const;

 private:
  friend struct detail::BlockMaskAccess;
  struct Impl;
  explicit BlockMask(std::unique_ptr<Impl> impl);
  std::unique_ptr<Impl> impl_;
};

struct DeviceInfo {
  int ordinal = 0;
  std::string name;
  int cc_major = 0, cc_minor = 0;
  int multiprocessors = 0;
  int max_shared_per_block_optin = 0;
  std::size_t total_memory = 0;
  std::size_t l2_cache_bytes = 0;
  std::string arch;  // the NVRTC target flashjit compiles for on it
};
// GPUs the driver reports. Throws Error(no_driver) without a driver.
FLASHJIT_API std::vector<DeviceInfo> devices();
FLASHJIT_API int driver_version();  // e.g. 13000; throws Error(no_driver)

// Runs attention forward on one GPU. Thread-safe: many threads may call forward concurrently.
class FLASHJIT_API Engine {
 public:
  // Throws Error(no_driver / no_device) when the GPU cannot be reached.
  explicit Engine(int device = 0, std::shared_ptr<KernelCache> cache = nullptr);
  ~Engine();
  Engine(const Engine&) = delete;
  Engine& operator=(const Engine&) = delete;

  const DeviceInfo& device() const;
  KernelCache& cache() const;
  // The device's primary context, which the engine retains (the one the CUDA runtime uses).
  CUctx_st* context() const;

  // out = softmax(q kᵀ · scale [+ causal mask]) v, per (batch, head); heads_q a multiple of
  // heads_kv (GQA/MQA). Zero-sized batch, heads or seqlen_q is a no-op; seqlen_k == 0 with
  // seqlen_q > 0 is an error. Invalid input throws Error(invalid_argument) before any launch.
  void forward(const TensorView& q, const TensorView& k, const TensorView& v,
               const TensorView& out, const ForwardOptions& options = {},
               CUstream_st* stream = nullptr);
  // The same over a KVCache (dense or paged, optionally with seqused_k). Once warm (this shape
  // ran before on this stream, or options.workspace is given) it neither allocates nor
  // synchronizes, so it can be captured in a CUDA graph.
  void forward(const TensorView& q, const KVCache& kv, const TensorView& out,
               const ForwardOptions& options = {}, CUstream_st* stream = nullptr);
  // A variable-length batch (VarlenBatch: packed q and out, a packed dense or a paged KVCache;
  // ForwardOptions::lse is then [heads_q, total_q]). Today the decode families run these, at
  // every query length.
  void forward(const TensorView& q, const KVCache& kv, const TensorView& out,
               const VarlenBatch& varlen, const ForwardOptions& options = {},
               CUstream_st* stream = nullptr);
  // Bytes of workspace a forward with these arguments needs (0 when it does not split).
  std::size_t workspace_bytes(const TensorView& q, const KVCache& kv, const TensorView& out,
                              const ForwardOptions& options = {}) const;
  std::size_t workspace_bytes(const TensorView& q, const KVCache& kv, const TensorView& out,
                              const VarlenBatch& varlen, const ForwardOptions& options = {}) const;

  // Builds the block mask of options.user_functions' mask_mod for these arguments, on `stream`
  // (asynchronously; it allocates device memory, so build it before capturing a CUDA graph).
  // The forward that takes it must have the same arguments otherwise (options.block_mask aside).
  // Throws Error(invalid_argument) without a mask_mod, or when the family that runs the problem
  // takes no block mask.
  BlockMask create_block_mask(const TensorView& q, const TensorView& k, const TensorView& v,
                              const TensorView& out, const ForwardOptions& options,
                              const BlockMaskOptions& mask_options = {},
                              CUstream_st* stream = nullptr);
  BlockMask create_block_mask(const TensorView& q, const KVCache& kv, const TensorView& out,
                              const ForwardOptions& options,
                              const BlockMaskOptions& mask_options = {},
                              CUstream_st* stream = nullptr);
  BlockMask create_block_mask(const TensorView& q, const KVCache& kv, const TensorView& out,
                              const VarlenBatch& varlen, const ForwardOptions& options,
                              const BlockMaskOptions& mask_options = {},
                              CUstream_st* stream = nullptr);

  // Builds the block masks of options.user_functions' mask_mod for a backward with these
  // arguments (BackwardOptions::block_mask): for the dK/dV kernel and, where one runs, the dQ
  // kernel that Engine::backward would run for them (options.family, tiles and deterministic
  // included). On `stream`, asynchronously; it allocates device memory. Throws
  // Error(invalid_argument) without a mask_mod.
  BlockMask create_backward_block_mask(const TensorView& q, const TensorView& k,
                                       const TensorView& v, const BackwardOptions& options,
                                       const BlockMaskOptions& mask_options = {},
                                       CUstream_st* stream = nullptr);
  BlockMask create_backward_block_mask(const TensorView& q, const TensorView& k,
                                       const TensorView& v, const VarlenBatch& varlen,
                                       const BackwardOptions& options,
                                       const BlockMaskOptions& mask_options = {},
                                       CUstream_st* stream = nullptr);

  // Merges two partial attention results over disjoint key sets (cascade / shared-prefix
  // attention, context-parallel ring attention): out = (e^lse_a·out_a + e^lse_b·out_b) /
  // (e^lse_a + e^lse_b) per row, lse_out = log(e^lse_a + e^lse_b). out_* are [batch, seqlen,
  // heads, head_dim] views with equal shapes, out_b with out_a's strides (except along dimensions
  // of extent 1, which address nothing); lse_* fp32 [batch, heads, seqlen]
  // contiguous (what ForwardOptions::lse holds), natural log, -inf for a state with no keys.
  // out may be out_a or out_b (in place); lse_out may be null, or lse_a / lse_b.
  void merge_attention_states(const TensorView& out_a, const float* lse_a,
                              const TensorView& out_b, const float* lse_b, const TensorView& out,
                              float* lse_out = nullptr, CUstream_st* stream = nullptr);
  // Gradients of forward(q, k, v, out) with the same softmax scale and mask: given dout =
  // dL/dout, writes dq, dk and dv (dL/dq, dL/dk, dL/dv; with GQA/MQA dk and dv are summed over
  // the query heads of each group). lse: the forward's fp32 [batch, heads_q, seqlen_q]
  // (ForwardOptions::lse), natural log. q, out, dout and dq have q's shape, k, v, dk and dv k's;
  // one dtype for all; any strides forward accepts (unit head_dim stride). Rows that saw no key
  // (LSE -inf) get zero gradients, and so do keys no row sees (all of them when seqlen_q is 0).
  // Zero-sized batch or heads is a no-op. Invalid input throws Error(invalid_argument) before any
  // launch. Once warm (this shape ran before on this stream, or options.workspace is given) it
  // neither allocates nor synchronizes, so it can be captured in a CUDA graph.
  void backward(const TensorView& q, const TensorView& k, const TensorView& v,
                const TensorView& out, const TensorView& dout, const float* lse,
                const TensorView& dq, const TensorView& dk, const TensorView& dv,
                const BackwardOptions& options = {}, CUstream_st* stream = nullptr);
  // The gradients of a variable-length forward (a VarlenBatch over a dense packed k and v): q,
  // out, dout and dq are [1, total_q, heads_q, head_dim], k, v, dk and dv [1, total_k, heads_kv,
  // head_dim], lse the forward's [heads_q, total_q]; each sequence is its own problem (its
  // causal mask bottom-right, its window, a sequence with no query or no key gives zero
  // gradients). Rows after cu_seqlens_q[batch] of dq and after cu_seqlens_k[batch] of dk and dv
  // are not written. Every option works as for equal-length batches.
  void backward(const TensorView& q, const TensorView& k, const TensorView& v,
                const TensorView& out, const TensorView& dout, const float* lse,
                const TensorView& dq, const TensorView& dk, const TensorView& dv,
                const VarlenBatch& varlen, const BackwardOptions& options = {},
                CUstream_st* stream = nullptr);
  // Bytes of workspace a backward with these arguments needs.
  std::size_t backward_workspace_bytes(const TensorView& q, const TensorView& k,
                                       const TensorView& v,
                                       const BackwardOptions& options = {}) const;
  std::size_t backward_workspace_bytes(const TensorView& q, const TensorView& k,
                                       const TensorView& v, const VarlenBatch& varlen,
                                       const BackwardOptions& options = {}) const;
  // The dK/dV variant backward runs for these arguments (validates them the same way).
  Variant select_backward_variant(const TensorView& q, const TensorView& k, const TensorView& v,
                                  const BackwardOptions& options = {}) const;
  Variant select_backward_variant(const TensorView& q, const TensorView& k, const TensorView& v,
                                  const VarlenBatch& varlen,
                                  const BackwardOptions& options = {}) const;

  // From now on, appends each variant this engine runs for the first time to `file` (a variant
  // manifest), as FLASHJIT_RECORD=file does from the engine's creation; an empty path stops.
  // Errors writing it are logged, never thrown from forward.
  void record_variants(const std::filesystem::path& file);

  // Never wait for NVRTC in forward: while the variant a problem wants is compiled neither in
  // memory nor in the disk cache, forward runs one that is (another family, or another tile
  // shape of the family) for the same problem, compiles the wanted one on a background thread,
  // and switches to it on the first call after it is ready. With no compiled stand-in it
  // compiles and waits as usual, and forced tiles are never replaced. Default off;
  // FLASHJIT_NEVER_BLOCK=1 turns it on for engines created after it is set.
  void set_never_block(bool on);
  // Waits until the background compiles started so far are done (tests, orderly shutdown; the
  // destructor waits too).
  void wait_for_background_compiles();
  // The variant a forward with these arguments runs right now: select_variant's, or its
  // stand-in while that compiles in the background.
  Variant running_variant(const TensorView& q, const TensorView& k, const TensorView& v,
                          const TensorView& out, const ForwardOptions& options = {},
                          CUstream_st* stream = nullptr) const;
  Variant running_variant(const TensorView& q, const KVCache& kv, const TensorView& out,
                          const ForwardOptions& options = {}, CUstream_st* stream = nullptr) const;

  // The variant forward would run for these arguments (validates them the same way).
  Variant select_variant(const TensorView& q, const TensorView& k, const TensorView& v,
                         const TensorView& out, const ForwardOptions& options = {}) const;
  Variant select_variant(const TensorView& q, const KVCache& kv, const TensorView& out,
                         const ForwardOptions& options = {}) const;
  Variant select_variant(const TensorView& q, const KVCache& kv, const TensorView& out,
                         const VarlenBatch& varlen, const ForwardOptions& options = {}) const;
  // The number of splits forward would use for these arguments (1: no split).
  int select_num_splits(const TensorView& q, const KVCache& kv, const TensorView& out,
                        const ForwardOptions& options = {}) const;
  int select_num_splits(const TensorView& q, const KVCache& kv, const TensorView& out,
                        const VarlenBatch& varlen, const ForwardOptions& options = {}) const;

 private:
  struct Impl;
  std::unique_ptr<Impl> impl_;
};

}  // namespace flashjit

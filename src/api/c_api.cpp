// The C API: the C++ API behind status codes and a thread-local error message. Its backward
// entry points are in c_api_backward.cpp.
#include <algorithm>
#include <cstring>
#include <iterator>
#include <string>

#include "api/c_api_support.hpp"

static_assert(FLASHJIT_MAX_USER_ARGS == flashjit::kMaxUserArgs,
              "flashjit.h and flashjit.hpp disagree on the number of user_args");

namespace flashjit::detail::c_api {

std::string& last_error() {
  thread_local std::string message;
  return message;
}

flashjit_status status_of(ErrorCode code) {
  switch (code) {
    case ErrorCode::invalid_argument: return FLASHJIT_INVALID_ARGUMENT;
    case ErrorCode::no_driver: return FLASHJIT_NO_DRIVER;
    case ErrorCode::no_device: return FLASHJIT_NO_DEVICE;
    case ErrorCode::compile_failed: return FLASHJIT_COMPILE_FAILED;
    case ErrorCode::cuda_error: return FLASHJIT_CUDA_ERROR;
    case ErrorCode::cache_error: return FLASHJIT_CACHE_ERROR;
    case ErrorCode::unsupported: return FLASHJIT_UNSUPPORTED;
  }
  return FLASHJIT_INTERNAL_ERROR;
}

void require(bool condition, const char* message) {
  if (!condition) throw Error(ErrorCode::invalid_argument, message);
}

Engine& engine_of(flashjit_engine* engine) {
  require(engine != nullptr, "engine is null: expected one from flashjit_engine_create");
  return *engine->engine;
}

TensorView view_of(const flashjit_tensor* t, const char* name) {
  if (t == nullptr)
    throw Error(ErrorCode::invalid_argument,
                std::string(name) + " is null: expected a flashjit_tensor");
  if (t->dtype != FLASHJIT_BF16 && t->dtype != FLASHJIT_FP16)
    throw Error(ErrorCode::invalid_argument,
                std::string(name) + ".dtype is not FLASHJIT_BF16 or FLASHJIT_FP16");
  TensorView view;
  view.data = t->data;
  view.dtype = t->dtype == FLASHJIT_BF16 ? DType::bf16 : DType::fp16;
  for (int i = 0; i < 4; ++i) {
    view.shape[i] = t->shape[i];
    view.stride[i] = t->stride[i];
  }
  return view;
}

void write_name(const std::string& name, char* buf, int32_t buf_size) {
  require(buf != nullptr && buf_size > 0, "buf is null or buf_size <= 0");
  require(static_cast<int32_t>(name.size()) < buf_size, "buf_size is too small for the name");
  std::memcpy(buf, name.c_str(), name.size() + 1);
}

VarlenBatch varlen_of(const flashjit_varlen* v) {
  require(v != nullptr, "varlen is null: expected a flashjit_varlen");
  return {v->cu_seqlens_q, v->cu_seqlens_k, v->batch, v->max_seqlen_q, v->max_seqlen_k};
}

}  // namespace flashjit::detail::c_api

namespace {

using namespace flashjit::detail::c_api;

flashjit::ForwardOptions options_of(const flashjit_forward_options* o) {
  flashjit::ForwardOptions options;
  if (o == nullptr) return options;
  if (o->softmax_scale > 0) options.softmax_scale = o->softmax_scale;
  options.causal = o->causal != 0;
  options.lse = o->lse;
  // An unknown name is refused by forward itself, with the list of families.
  if (o->family != nullptr && *o->family != '\0') options.family = std::string(o->family);
  if (o->tile_m != 0 || o->tile_n != 0 || o->stages != 0)
    options.tiles = flashjit::TileConfig{o->tile_m, o->tile_n, o->stages};
  options.num_splits = o->num_splits;
  options.workspace = o->workspace;
  options.workspace_bytes = static_cast<std::size_t>(o->workspace_bytes);
  options.softcap = o->softcap;
  if (o->sliding_window != 0) {
    options.window_left = o->window_left;
    options.window_right = o->window_right;
  }
  options.sink_logits = o->sink_logits;
  options.alibi_slopes = o->alibi_slopes;
  options.sink_tokens = o->sink_tokens;
  if (o->user_functions != nullptr) options.user_functions = &o->user_functions->functions;
  std::copy(std::begin(o->user_args), std::end(o->user_args), options.user_args.begin());
  if (o->block_mask != nullptr) options.block_mask = &o->block_mask->mask;
  return options;
}

flashjit::KVCache kv_of(const flashjit_kv_cache* kv) {
  require(kv != nullptr, "kv is null: expected a flashjit_kv_cache");
  flashjit::KVCache cache;
  cache.k = view_of(&kv->k, "kv.k");
  cache.v = view_of(&kv->v, "kv.v");
  cache.page_table = kv->page_table;
  cache.pages_per_seq = kv->pages_per_seq;
  cache.page_table_stride = kv->page_table_stride != 0 ? kv->page_table_stride : kv->pages_per_seq;
  cache.seqused_k = kv->seqused_k;
  return cache;
}

// Family `index` of families(), or null when the index is out of range.
const flashjit::FamilyInfo* family_at(int32_t index) {
  const auto& families = flashjit::families();
  if (index < 0 || index >= static_cast<int32_t>(families.size())) return nullptr;
  return &families[static_cast<std::size_t>(index)];
}

// A C string argument that may be NULL for "absent".
std::string text_or_empty(const char* text) { return text != nullptr ? text : ""; }

// Fills *out with the user functions `make` returns (NULL first, so a failure leaves NULL).
template <typename Make>
flashjit_status make_user_functions(flashjit_user_functions** out, Make&& make) {
  return guarded([&] {
    require(out != nullptr, "out is null: expected a flashjit_user_functions** to fill");
    *out = nullptr;
    *out = new flashjit_user_functions{make()};
  });
}

const flashjit::BlockMask& mask_of(const flashjit_block_mask* mask) {
  require(mask != nullptr, "mask is null: expected one from flashjit_block_mask_create");
  return mask->mask;
}

}  // namespace

extern "C" {

const char* flashjit_version(void) {
  static const std::string text(flashjit::version());
  return text.c_str();
}

const char* flashjit_nvrtc_version(void) {
  static const std::string text = flashjit::nvrtc_version();
  return text.c_str();
}

flashjit_status flashjit_driver_version(int32_t* version) {
  return guarded([&] {
    require(version != nullptr, "version is null: expected an int32_t* to fill");
    *version = flashjit::driver_version();
  });
}

const char* flashjit_last_error(void) { return last_error().c_str(); }

int32_t flashjit_family_count(void) { return static_cast<int32_t>(flashjit::families().size()); }

const char* flashjit_family_name(int32_t index) {
  const flashjit::FamilyInfo* family = family_at(index);
  return family != nullptr ? family->name.c_str() : nullptr;
}

int32_t flashjit_family_is_attention(int32_t index) {
  const flashjit::FamilyInfo* family = family_at(index);
  return family != nullptr && family->attention ? 1 : 0;
}

int32_t flashjit_family_is_backward(int32_t index) {
  const flashjit::FamilyInfo* family = family_at(index);
  return family != nullptr && family->backward ? 1 : 0;
}

flashjit_status flashjit_engine_create(int device, const char* cache_dir,
                                       flashjit_engine** engine) {
  return guarded([&] {
    require(engine != nullptr, "engine is null: expected a flashjit_engine** to fill");
    *engine = nullptr;
    flashjit::CacheOptions options;
    if (cache_dir != nullptr && *cache_dir != '\0') options.dir = cache_dir;
    auto made = std::make_unique<flashjit_engine>();
    made->engine = std::make_unique<flashjit::Engine>(
        device, std::make_shared<flashjit::KernelCache>(options));
    *engine = made.release();
  });
}

void flashjit_engine_destroy(flashjit_engine* engine) { delete engine; }

flashjit_status flashjit_engine_set_never_block(flashjit_engine* engine, int32_t on) {
  return guarded([&] { engine_of(engine).set_never_block(on != 0); });
}

flashjit_status flashjit_engine_record(flashjit_engine* engine, const char* manifest_path) {
  return guarded([&] {
    flashjit::Engine& target = engine_of(engine);
    require(manifest_path != nullptr && *manifest_path != '\0',
            "manifest_path is null or empty: expected a file to append variant names to");
    target.record_variants(manifest_path);
  });
}

flashjit_status flashjit_forward(flashjit_engine* engine, const flashjit_tensor* q,
                                 const flashjit_tensor* k, const flashjit_tensor* v,
                                 const flashjit_tensor* out,
                                 const flashjit_forward_options* options, void* stream) {
  return guarded([&] {
    engine_of(engine).forward(view_of(q, "q"), view_of(k, "k"), view_of(v, "v"),
                              view_of(out, "out"), options_of(options),
                              static_cast<CUstream_st*>(stream));
  });
}

flashjit_status flashjit_select_variant(flashjit_engine* engine, const flashjit_tensor* q,
                                        const flashjit_tensor* k, const flashjit_tensor* v,
                                        const flashjit_tensor* out,
                                        const flashjit_forward_options* options, char* buf,
                                        int32_t buf_size) {
  return guarded([&] {
    write_name(engine_of(engine)
                   .select_variant(view_of(q, "q"), view_of(k, "k"), view_of(v, "v"),
                                   view_of(out, "out"), options_of(options))
                   .name(),
               buf, buf_size);
  });
}

flashjit_status flashjit_forward_kv(flashjit_engine* engine, const flashjit_tensor* q,
                                    const flashjit_kv_cache* kv, const flashjit_tensor* out,
                                    const flashjit_forward_options* options, void* stream) {
  return guarded([&] {
    engine_of(engine).forward(view_of(q, "q"), kv_of(kv), view_of(out, "out"),
                              options_of(options), static_cast<CUstream_st*>(stream));
  });
}

flashjit_status flashjit_forward_varlen(flashjit_engine* engine, const flashjit_tensor* q,
                                        const flashjit_kv_cache* kv, const flashjit_tensor* out,
                                        const flashjit_varlen* varlen,
                                        const flashjit_forward_options* options, void* stream) {
  return guarded([&] {
    engine_of(engine).forward(view_of(q, "q"), kv_of(kv), view_of(out, "out"), varlen_of(varlen),
                              options_of(options), static_cast<CUstream_st*>(stream));
  });
}

flashjit_status flashjit_workspace_bytes_varlen(flashjit_engine* engine, const flashjit_tensor* q,
                                                const flashjit_kv_cache* kv,
                                                const flashjit_tensor* out,
                                                const flashjit_varlen* varlen,
                                                const flashjit_forward_options* options,
                                                uint64_t* bytes) {
  return guarded([&] {
    flashjit::Engine& target = engine_of(engine);
    require(bytes != nullptr, "bytes is null: expected a uint64_t* to fill");
    *bytes = target.workspace_bytes(view_of(q, "q"), kv_of(kv), view_of(out, "out"),
                                    varlen_of(varlen), options_of(options));
  });
}

flashjit_status flashjit_workspace_bytes(flashjit_engine* engine, const flashjit_tensor* q,
                                         const flashjit_kv_cache* kv, const flashjit_tensor* out,
                                         const flashjit_forward_options* options,
                                         uint64_t* bytes, int32_t* num_splits) {
  return guarded([&] {
    flashjit::Engine& target = engine_of(engine);
    require(bytes != nullptr, "bytes is null: expected a uint64_t* to fill");
    const auto query = view_of(q, "q");
    const auto cache = kv_of(kv);
    const auto result = view_of(out, "out");
    const auto opts = options_of(options);
    *bytes = target.workspace_bytes(query, cache, result, opts);
    if (num_splits != nullptr) *num_splits = target.select_num_splits(query, cache, result, opts);
  });
}

flashjit_status flashjit_merge_attention_states(flashjit_engine* engine,
                                                const flashjit_tensor* out_a, const float* lse_a,
                                                const flashjit_tensor* out_b, const float* lse_b,
                                                const flashjit_tensor* out, float* lse_out,
                                                void* stream) {
  return guarded([&] {
    engine_of(engine).merge_attention_states(view_of(out_a, "out_a"), lse_a,
                                             view_of(out_b, "out_b"), lse_b, view_of(out, "out"),
                                             lse_out, static_cast<CUstream_st*>(stream));
  });
}

flashjit_status flashjit_select_variant_kv(flashjit_engine* engine, const flashjit_tensor* q,
                                           const flashjit_kv_cache* kv, const flashjit_tensor* out,
                                           const flashjit_forward_options* options, char* buf,
                                           int32_t buf_size) {
  return guarded([&] {
    write_name(engine_of(engine)
                   .select_variant(view_of(q, "q"), kv_of(kv), view_of(out, "out"),
                                   options_of(options))
                   .name(),
               buf, buf_size);
  });
}

flashjit_status flashjit_user_functions_create(const char* score_mod, const char* mask_mod,
                                               const char* score_mod_grad,
                                               flashjit_user_functions** out) {
  return make_user_functions(out, [&] {
    return flashjit::UserFunctions(text_or_empty(score_mod), text_or_empty(mask_mod),
                                   text_or_empty(score_mod_grad));
  });
}

flashjit_status flashjit_user_functions_from_files(const char* score_mod_file,
                                                   const char* mask_mod_file,
                                                   const char* score_mod_grad_file,
                                                   flashjit_user_functions** out) {
  return make_user_functions(out, [&] {
    return flashjit::UserFunctions::from_files(text_or_empty(score_mod_file),
                                               text_or_empty(mask_mod_file),
                                               text_or_empty(score_mod_grad_file));
  });
}

const char* flashjit_user_functions_hash(const flashjit_user_functions* functions) {
  return functions != nullptr ? functions->functions.hash().c_str() : nullptr;
}

void flashjit_user_functions_destroy(flashjit_user_functions* functions) { delete functions; }

flashjit_status flashjit_block_mask_create(flashjit_engine* engine, const flashjit_tensor* q,
                                           const flashjit_tensor* k, const flashjit_tensor* v,
                                           const flashjit_tensor* out,
                                           const flashjit_forward_options* options,
                                           int32_t same_for_all_heads,
                                           int32_t same_for_all_batches, void* stream,
                                           flashjit_block_mask** mask) {
  return make_block_mask(mask, same_for_all_heads, same_for_all_batches, [&](const auto& how) {
    return engine_of(engine).create_block_mask(view_of(q, "q"), view_of(k, "k"), view_of(v, "v"),
                                               view_of(out, "out"), options_of(options), how,
                                               static_cast<CUstream_st*>(stream));
  });
}

flashjit_status flashjit_block_mask_create_kv(flashjit_engine* engine, const flashjit_tensor* q,
                                              const flashjit_kv_cache* kv,
                                              const flashjit_tensor* out,
                                              const flashjit_forward_options* options,
                                              int32_t same_for_all_heads,
                                              int32_t same_for_all_batches, void* stream,
                                              flashjit_block_mask** mask) {
  return make_block_mask(mask, same_for_all_heads, same_for_all_batches, [&](const auto& how) {
    return engine_of(engine).create_block_mask(view_of(q, "q"), kv_of(kv), view_of(out, "out"),
                                               options_of(options), how,
                                               static_cast<CUstream_st*>(stream));
  });
}

flashjit_status flashjit_block_mask_create_varlen(
    flashjit_engine* engine, const flashjit_tensor* q, const flashjit_kv_cache* kv,
    const flashjit_tensor* out, const flashjit_varlen* varlen,
    const flashjit_forward_options* options, int32_t same_for_all_heads,
    int32_t same_for_all_batches, void* stream, flashjit_block_mask** mask) {
  return make_block_mask(mask, same_for_all_heads, same_for_all_batches, [&](const auto& how) {
    return engine_of(engine).create_block_mask(view_of(q, "q"), kv_of(kv), view_of(out, "out"),
                                               varlen_of(varlen), options_of(options), how,
                                               static_cast<CUstream_st*>(stream));
  });
}

void flashjit_block_mask_destroy(flashjit_block_mask* mask) { delete mask; }

flashjit_status flashjit_block_mask_counts(const flashjit_block_mask* mask, int64_t* partial,
                                           int64_t* full, int64_t* total) {
  return guarded([&] {
    const flashjit::BlockMask::Counts counts = mask_of(mask).counts();
    if (partial != nullptr) *partial = counts.partial;
    if (full != nullptr) *full = counts.full;
    if (total != nullptr) *total = counts.total;
  });
}

flashjit_status flashjit_block_mask_variant(const flashjit_block_mask* mask, char* buf,
                                            int32_t buf_size) {
  return guarded([&] { write_name(mask_of(mask).variant().name(), buf, buf_size); });
}

flashjit_status flashjit_precompile(const char* cache_dir, const char* const* variant_names,
                                    int32_t count) {
  return guarded([&] {
    require(count >= 0 && (count == 0 || variant_names != nullptr),
            "variant_names is null or count < 0");
    std::vector<flashjit::Variant> variants;
    for (int32_t i = 0; i < count; ++i) {
      if (variant_names[i] == nullptr)
        throw flashjit::Error(
            flashjit::ErrorCode::invalid_argument,
            "variant_names[" + std::to_string(i) + "] is null: expected a variant name");
      variants.push_back(flashjit::Variant::parse(variant_names[i]));
    }
    flashjit::CacheOptions options;
    if (cache_dir != nullptr && *cache_dir != '\0') options.dir = cache_dir;
    flashjit::KernelCache cache(options);
    // Compiling into memory only would report success for nothing kept.
    if (!cache.directory())
      throw flashjit::Error(flashjit::ErrorCode::cache_error,
                            "nothing can be cached: " + cache.why_not_persistent());
    std::string failures;
    for (const auto& outcome : cache.precompile(variants))
      if (!outcome.ok) failures += outcome.variant.name() + ": " + outcome.error + "\n";
    if (!failures.empty()) throw flashjit::Error(flashjit::ErrorCode::compile_failed, failures);
  });
}

}  // extern "C"

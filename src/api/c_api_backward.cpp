// The C API's backward entry points: Engine::backward and what goes with it, behind status codes.
#include <algorithm>
#include <cstddef>
#include <iterator>
#include <string>

#include "api/c_api_support.hpp"

namespace {

using namespace flashjit::detail::c_api;

flashjit::BackwardOptions options_of(const flashjit_backward_options* o) {
  flashjit::BackwardOptions options;
  if (o == nullptr) return options;
  if (o->softmax_scale > 0) options.softmax_scale = o->softmax_scale;
  options.causal = o->causal != 0;
  options.deterministic = o->deterministic != 0;
  // An unknown or forward-only name is refused by backward itself, with the list of families.
  if (o->family != nullptr && *o->family != '\0') options.family = std::string(o->family);
  if (o->tile_m != 0 || o->tile_n != 0 || o->stages != 0)
    options.tiles = flashjit::TileConfig{o->tile_m, o->tile_n, o->stages};
  options.workspace = o->workspace;
  options.workspace_bytes = static_cast<std::size_t>(o->workspace_bytes);
  options.alibi_slopes = o->alibi_slopes;
  options.sink_logits = o->sink_logits;
  options.d_sink_logits = o->d_sink_logits;
  options.softcap = o->softcap;
  if (o->sliding_window != 0) {
    options.window_left = o->window_left;
    options.window_right = o->window_right;
  }
  options.sink_tokens = o->sink_tokens;
  if (o->user_functions != nullptr) options.user_functions = &o->user_functions->functions;
  std::copy(std::begin(o->user_args), std::end(o->user_args), options.user_args.begin());
  if (o->block_mask != nullptr) options.block_mask = &o->block_mask->mask;
  return options;
}

// q, k and v of a call, read in argument order (so the first null one is named).
struct QkvViews {
  flashjit::TensorView q, k, v;
  QkvViews(const flashjit_tensor* q_, const flashjit_tensor* k_, const flashjit_tensor* v_)
      : q(view_of(q_, "q")), k(view_of(k_, "k")), v(view_of(v_, "v")) {}
};

// The eight tensors of a backward call, the same way.
struct BackwardViews : QkvViews {
  flashjit::TensorView out, dout, dq, dk, dv;
  BackwardViews(const flashjit_tensor* q_, const flashjit_tensor* k_, const flashjit_tensor* v_,
                const flashjit_tensor* out_, const flashjit_tensor* dout_,
                const flashjit_tensor* dq_, const flashjit_tensor* dk_, const flashjit_tensor* dv_)
      : QkvViews(q_, k_, v_),
        out(view_of(out_, "out")),
        dout(view_of(dout_, "dout")),
        dq(view_of(dq_, "dq")),
        dk(view_of(dk_, "dk")),
        dv(view_of(dv_, "dv")) {}
};

}  // namespace

// Each function reads its tensors (in argument order, one statement each) before the engine:
// every argument check but the engine's own then runs without a GPU, and a call names its first
// null tensor wherever it runs.
extern "C" {

flashjit_status flashjit_backward(flashjit_engine* engine, const flashjit_tensor* q,
                                  const flashjit_tensor* k, const flashjit_tensor* v,
                                  const flashjit_tensor* out, const flashjit_tensor* dout,
                                  const float* lse, const flashjit_tensor* dq,
                                  const flashjit_tensor* dk, const flashjit_tensor* dv,
                                  const flashjit_backward_options* options, void* stream) {
  return guarded([&] {
    const BackwardViews views(q, k, v, out, dout, dq, dk, dv);
    engine_of(engine).backward(views.q, views.k, views.v, views.out, views.dout, lse, views.dq,
                               views.dk, views.dv, options_of(options),
                               static_cast<CUstream_st*>(stream));
  });
}

flashjit_status flashjit_backward_varlen(flashjit_engine* engine, const flashjit_tensor* q,
                                         const flashjit_tensor* k, const flashjit_tensor* v,
                                         const flashjit_tensor* out, const flashjit_tensor* dout,
                                         const float* lse, const flashjit_tensor* dq,
                                         const flashjit_tensor* dk, const flashjit_tensor* dv,
                                         const flashjit_varlen* varlen,
                                         const flashjit_backward_options* options, void* stream) {
  return guarded([&] {
    const BackwardViews views(q, k, v, out, dout, dq, dk, dv);
    const flashjit::VarlenBatch batch = varlen_of(varlen);
    engine_of(engine).backward(views.q, views.k, views.v, views.out, views.dout, lse, views.dq,
                               views.dk, views.dv, batch, options_of(options),
                               static_cast<CUstream_st*>(stream));
  });
}

flashjit_status flashjit_backward_workspace_bytes(flashjit_engine* engine, const flashjit_tensor* q,
                                                  const flashjit_tensor* k,
                                                  const flashjit_tensor* v,
                                                  const flashjit_backward_options* options,
                                                  uint64_t* bytes) {
  return guarded([&] {
    const QkvViews views(q, k, v);
    flashjit::Engine& target = engine_of(engine);
    require(bytes != nullptr, "bytes is null: expected a uint64_t* to fill");
    *bytes = target.backward_workspace_bytes(views.q, views.k, views.v, options_of(options));
  });
}

flashjit_status flashjit_backward_workspace_bytes_varlen(
    flashjit_engine* engine, const flashjit_tensor* q, const flashjit_tensor* k,
    const flashjit_tensor* v, const flashjit_varlen* varlen,
    const flashjit_backward_options* options, uint64_t* bytes) {
  return guarded([&] {
    const QkvViews views(q, k, v);
    const flashjit::VarlenBatch batch = varlen_of(varlen);
    flashjit::Engine& target = engine_of(engine);
    require(bytes != nullptr, "bytes is null: expected a uint64_t* to fill");
    *bytes = target.backward_workspace_bytes(views.q, views.k, views.v, batch, options_of(options));
  });
}

flashjit_status flashjit_select_backward_variant(flashjit_engine* engine, const flashjit_tensor* q,
                                                 const flashjit_tensor* k, const flashjit_tensor* v,
                                                 const flashjit_backward_options* options,
                                                 char* buf, int32_t buf_size) {
  return guarded([&] {
    const QkvViews views(q, k, v);
    flashjit::Engine& target = engine_of(engine);
    write_name(
        target.select_backward_variant(views.q, views.k, views.v, options_of(options)).name(), buf,
        buf_size);
  });
}

flashjit_status flashjit_select_backward_variant_varlen(
    flashjit_engine* engine, const flashjit_tensor* q, const flashjit_tensor* k,
    const flashjit_tensor* v, const flashjit_varlen* varlen,
    const flashjit_backward_options* options, char* buf, int32_t buf_size) {
  return guarded([&] {
    const QkvViews views(q, k, v);
    const flashjit::VarlenBatch batch = varlen_of(varlen);
    flashjit::Engine& target = engine_of(engine);
    write_name(target.select_backward_variant(views.q, views.k, views.v, batch, options_of(options))
                   .name(),
               buf, buf_size);
  });
}


flashjit_status flashjit_backward_block_mask_create(flashjit_engine* engine,
                                                    const flashjit_tensor* q,
                                                    const flashjit_tensor* k,
                                                    const flashjit_tensor* v,
                                                    const flashjit_backward_options* options,
                                                    int32_t same_for_all_heads,
                                                    int32_t same_for_all_batches, void* stream,
                                                    flashjit_block_mask** mask) {
  return make_block_mask(mask, same_for_all_heads, same_for_all_batches, [&](const auto& how) {
    const QkvViews views(q, k, v);
    return engine_of(engine).create_backward_block_mask(views.q, views.k, views.v,
                                                        options_of(options), how,
                                                        static_cast<CUstream_st*>(stream));
  });
}

flashjit_status flashjit_backward_block_mask_create_varlen(
    flashjit_engine* engine, const flashjit_tensor* q, const flashjit_tensor* k,
    const flashjit_tensor* v, const flashjit_varlen* varlen,
    const flashjit_backward_options* options, int32_t same_for_all_heads,
    int32_t same_for_all_batches, void* stream, flashjit_block_mask** mask) {
  return make_block_mask(mask, same_for_all_heads, same_for_all_batches, [&](const auto& how) {
    const QkvViews views(q, k, v);
    const flashjit::VarlenBatch batch = varlen_of(varlen);
    return engine_of(engine).create_backward_block_mask(views.q, views.k, views.v, batch,
                                                        options_of(options), how,
                                                        static_cast<CUstream_st*>(stream));
  });
}

}  // extern "C"

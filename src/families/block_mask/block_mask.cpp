#include "families/block_mask/block_mask.hpp"

#include <fmt/format.h>

#include "block_mask/shape.cuh"
#include "families/query_tile.hpp"
#include "families/registry.hpp"

namespace flashjit::detail {
namespace {

constexpr DType kMaskDType = DType::bf16;
constexpr int kMaskHeadDims[] = {64};

std::string block_mask_check(const Variant& v) {
  if (v.dtype != kMaskDType) return "block-mask variants are bf16 (a mask has no data type)";
  if (v.stages != 1) return "block-mask variants have stages 1 (they load no tiles)";
  if (v.tile_m < 1 || v.tile_n < 1 || v.tile_m > 1024 || v.tile_n > 1024)
    return fmt::format("tile_m {} and tile_n {} must be in [1, 1024]", v.tile_m, v.tile_n);
  if (v.paged || v.softcap || v.sink || v.alibi)
    return "block-mask variants have none of .paged, .softcap, .sink, .alibi (they change no "
           "mask)";
  return {};
}

int block_mask_shared_bytes(const Variant&) { return 0; }

TileTable block_mask_tiles(std::string_view, int, bool, bool) {
  return TileTable::single({64, 64, 1});  // never picked: the attention variant's tiles are
}

std::string block_mask_arguments(const Variant& v) {
  return fmt::format("{}, {}, {}, {}, {}", v.tile_m, v.tile_n, v.causal, v.window, v.varlen);
}

// The forward's and the backward's builders differ only in the map they list (their kernel).
constexpr KernelFamily builder_family(std::string_view name, std::string_view summary,
                                      std::string_view source_file,
                                      std::string_view kernel_template) {
  return {
      .role = FamilyRole::block_mask,
      .features = kFeatureUserFunctions | kFeatureWindow | kFeatureVarlen,
      .name = name,
      .summary = summary,
      .source_file = source_file,
      .kernel_template = kernel_template,
      .head_dims = kMaskHeadDims,
      .runs_on = runs_on_sm80_or_later,
      .check_tiles = block_mask_check,
      .shared_bytes = block_mask_shared_bytes,
      .tile_table = block_mask_tiles,
      .unsupported_reason = nullptr,
      .plan = nullptr,
      .template_arguments = block_mask_arguments,
      .varlen_variants = true,
  };
}

}  // namespace

constinit extern const KernelFamily kBlockMaskFamily = builder_family(
    "blockmask", "lists the key tiles a user mask_mod leaves to each query tile (create_block_mask)",
    "block_mask/kernel.cu", "flashjit::build_block_mask_kernel");

// The backward's builder (block_mask/backward_kernel.cu): the key-major map of a dK/dV variant.
constinit extern const KernelFamily kBwdBlockMaskFamily = builder_family(
    "bwd_blockmask",
    "lists the query tiles a user mask_mod leaves to each key tile of a backward "
    "(create_backward_block_mask)",
    "block_mask/backward_kernel.cu", "flashjit::build_backward_block_mask_kernel");

Variant block_mask_variant(const Variant& attention) {
  Variant v = variant_of(kBlockMaskFamily, attention.arch, kMaskDType, kMaskHeadDims[0],
                         attention.causal, {attention.tile_m, attention.tile_n, 1}, false,
                         attention.varlen, false, attention.window, false, false,
                         attention.user_functions);
  return v;
}

LaunchPlan block_mask_plan(int query_tiles, int heads, int batches) {
  LaunchPlan plan;
  plan.grid = {static_cast<unsigned>(query_tiles), static_cast<unsigned>(heads),
               static_cast<unsigned>(batches)};
  plan.block = {BlockMaskShape::kThreads, 1, 1};
  return plan;
}

}  // namespace flashjit::detail

namespace flashjit::detail {

Variant backward_block_mask_variant(const Variant& dkdv) {
  return variant_of(kBwdBlockMaskFamily, dkdv.arch, kMaskDType, kMaskHeadDims[0], dkdv.causal,
                    {dkdv.tile_m, dkdv.tile_n, 1}, false, dkdv.varlen, false, dkdv.window, false,
                    false, dkdv.user_functions);
}

}  // namespace flashjit::detail

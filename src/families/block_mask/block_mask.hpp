// The block-mask builder (kernels_src/block_mask/kernel.cu): evaluates a mask_mod over every score
// a forward of one attention variant would compute and lists, per query tile, the key tiles to
// visit (Engine::create_block_mask). Not an attention family: forward never dispatches to it.
// Its variants copy the attention variant's arch, tiles, masks and user functions; dtype and head
// dim do not change a mask, so they are fixed (bf16, d64) and one build serves every head dim.
#pragma once

#include "cuda/launch.hpp"
#include "flashjit/flashjit.hpp"

namespace flashjit::detail {

// The builder for the block masks of `attention` (a variant with user functions).
Variant block_mask_variant(const Variant& attention);
// The builder of a backward's key-major map for the dK/dV variant `dkdv` (a variant with user
// functions): same arch, tiles, masks and user functions (family bwd_blockmask).
Variant backward_block_mask_variant(const Variant& dkdv);
// One CTA per map entry: query tiles x heads x batches of the map.
LaunchPlan block_mask_plan(int query_tiles, int heads, int batches);

}  // namespace flashjit::detail

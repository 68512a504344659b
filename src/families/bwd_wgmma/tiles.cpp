#include "families/bwd_wgmma/tiles.hpp"

#include <algorithm>
#include <iterator>

namespace flashjit::detail {
namespace {

struct TileRow {
  int head_dim;
  TileConfig dkdv, dq;
};

// Not measured on a GPU yet: FlashAttention-3's backward shapes where our kernels take them, each
// compiling with no spills at 240 registers a consumer (two consumers, 384 threads) and keeping
// two stages. A dK/dV consumer holds dK and dV of its 64 keys (head_dim registers) and Sᵀ, dPᵀ of
// tile_m queries (tile_m registers): d64 takes 128 query rows a step, d128 64; at d256 two
// consumers share 64 keys, one gradient each (BwdWgmmaShape::split_roles). A dQ consumer holds
// dQ (head_dim / 2) and S, dP of tile_n keys (tile_n): at d256 Q and dO (64 KB each for 128 rows)
// leave room for two stages of 32 keys.
// clang-format off
constexpr TileRow kTiles[] = {
    // d    dK/dV (m, n, s)   dQ (m, n, s)
    { 64, {128, 128, 2}, {128, 128, 2}},
    {128, { 64, 128, 2}, {128,  64, 2}},
    {256, { 64,  64, 2}, {128,  32, 2}},
};
// clang-format on

const TileRow& row_for(int head_dim) {
  const auto row = std::find_if(std::begin(kTiles), std::end(kTiles),
                                [&](const TileRow& r) { return r.head_dim == head_dim; });
  return row != std::end(kTiles) ? *row : kTiles[0];
}

}  // namespace

TileConfig bwd_wgmma_tiles_for(int head_dim) { return row_for(head_dim).dkdv; }
TileConfig bwd_wgmma_dq_tiles_for(int head_dim) { return row_for(head_dim).dq; }

}  // namespace flashjit::detail

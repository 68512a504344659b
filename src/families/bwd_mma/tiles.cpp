#include "families/bwd_mma/tiles.hpp"

#include <algorithm>
#include <iterator>

#include "core/arch.hpp"

namespace flashjit::detail {
namespace {

struct TileRow {
  int max_shared_kb;  // the arch class: 99, 163 or 227
  int head_dim;
  TileConfig dkdv, dq;
};

// Head dims up to 128 keep dK and dV of 16 keys x head_dim per warp in registers (128 at d128);
// beyond, two warps share a key row (BwdMmaShape::dim_split), 8 warps for 64 keys. 32 query rows
// a step at d128 leave room for S and dP next to dK and dV (64 rows: see docs/perf-log.md).
// clang-format off
constexpr TileRow kTiles[] = {
    // smem  d     dK/dV (m, n, s)  dQ (m, n, s)
    {227,  32, {64, 64, 2}, {64, 64, 2}},
    {227,  64, {64, 64, 2}, {64, 64, 2}},
    {227,  96, {64, 64, 2}, {64, 64, 2}},
    {227, 128, {32, 64, 2}, {64, 64, 2}},
    {227, 192, {32, 64, 2}, {64, 32, 2}},
    {227, 256, {32, 64, 2}, {64, 32, 2}},
    {163,  32, {64, 64, 2}, {64, 64, 2}},
    {163,  64, {64, 64, 2}, {64, 64, 2}},
    {163,  96, {64, 64, 2}, {64, 64, 2}},
    {163, 128, {32, 64, 2}, {64, 64, 2}},
    {163, 192, {32, 64, 1}, {64, 32, 2}},
    {163, 256, {32, 64, 1}, {64, 32, 2}},
    { 99,  32, {64, 64, 2}, {64, 64, 2}},
    { 99,  64, {64, 64, 2}, {64, 64, 2}},
    { 99,  96, {64, 64, 1}, {64, 32, 1}},
    { 99, 128, {32, 64, 2}, {64, 64, 1}},
    { 99, 192, {32, 32, 1}, {64, 32, 1}},
    { 99, 256, {16, 32, 1}, {32, 16, 1}},
};
// clang-format on

const TileRow& row_for(std::string_view arch, int head_dim) {
  const int kb = max_shared_bytes_per_block(arch) / 1024;
  const int smem = kb >= 227 ? 227 : kb >= 163 ? 163 : 99;
  const auto row = std::find_if(std::begin(kTiles), std::end(kTiles), [&](const TileRow& r) {
    return r.max_shared_kb == smem && r.head_dim == head_dim;
  });
  return row != std::end(kTiles) ? *row : kTiles[0];
}

}  // namespace

TileConfig bwd_mma_tiles_for(std::string_view arch, int head_dim) {
  return row_for(arch, head_dim).dkdv;
}
TileConfig bwd_mma_dq_tiles_for(std::string_view arch, int head_dim) {
  return row_for(arch, head_dim).dq;
}

}  // namespace flashjit::detail

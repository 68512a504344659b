// Block masks (Engine::create_block_mask, ForwardOptions::block_mask): what one holds, how it is
// sized for an attention variant and a problem, and how a forward checks and uses it.
#pragma once

#include <array>
#include <memory>
#include <optional>
#include <string>

#include "core/problem.hpp"
#include "flashjit/device_memory.hpp"
#include "flashjit/flashjit.hpp"

namespace flashjit::detail {

// What a block mask depends on besides the user_args' contents: the sizes, lengths and masks of
// the problem it was built for. A forward with another of these cannot use it.
struct MaskedShape {
  static constexpr int kFields = 14;
  std::array<long long, kFields> values{};
  std::array<const void*, 3> lengths{};  // cu_seqlens_q, cu_seqlens_k, seqused_k
  std::string user_functions;

  static MaskedShape of(const ForwardProblem& problem);
  // Empty when equal, else the first field that differs with both values.
  std::string difference(const MaskedShape& forward) const;
};

struct BlockMaskData {
  Variant variant;  // the attention variant it lists tiles for
  MaskedShape shape;
  int query_tiles = 0, key_tiles = 0;  // per sequence
  int heads = 0, batches = 0;          // of the map: 1 when shared by all
  std::optional<DeviceBuffer> memory;  // counts, then tiles; none for an empty map
  std::size_t tiles_offset = 0;

  long long entries() const { return static_cast<long long>(query_tiles) * heads * batches; }
  const int* counts() const;
  const int* tiles() const;
};

struct BlockMaskAccess {
  static const BlockMaskData& data(const BlockMask& mask);
  static BlockMask make(BlockMaskData data);
};

// The map of `attention` (which takes block masks) for `problem`, its memory allocated on the
// engine's device (contents not yet built). Throws Error(invalid_argument) for options that
// cannot share one (same_for_all_batches with per-sequence lengths) or a map past the grid.
BlockMaskData plan_block_mask(const Engine& engine, const Variant& attention,
                              const ForwardProblem& problem, const BlockMaskOptions& options);
// Points a launch's params at the map.
void use_block_mask(FmhaParams& params, const BlockMaskData& mask);
// Throws Error(invalid_argument) unless the mask was built for this problem (family: the forced
// one, if any).
void check_block_mask(const BlockMaskData& mask, const ForwardProblem& problem,
                      const std::optional<std::string>& family);

}  // namespace flashjit::detail

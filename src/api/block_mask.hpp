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

// A forward's map has an entry per (batch, head, query tile) listing key tiles; a backward's
// (create_backward_block_mask) is key-major: an entry per (batch, KV head, key tile) listing the
// dK/dV kernel's steps, up to group x query_tiles of them (kernels_src/common/bwd_block_mask.cuh),
// and holds the forward kind of map at the dQ kernel's tiles where one runs.
struct BlockMaskData {
  Variant variant;  // the attention variant it lists tiles for; a backward's dK/dV variant
  MaskedShape shape;
  int query_tiles = 0, key_tiles = 0;  // per sequence
  int heads = 0, batches = 0;          // of the map: 1 when shared by all (KV heads: backward)
  bool shared_heads = false;           // same_for_all_heads
  bool backward = false;               // key-major, for a dK/dV kernel
  int heads_kv = 0, group = 1;         // backward: the problem's KV heads and heads_q / heads_kv
  std::shared_ptr<const BlockMaskData> dq;  // backward: the dQ kernel's map, if one runs
  std::optional<DeviceBuffer> memory;  // counts, then tiles; none for an empty map
  std::size_t tiles_offset = 0;

  int rows() const { return backward ? key_tiles : query_tiles; }  // entries per (batch, head)
  int slots() const { return backward ? group * query_tiles : key_tiles; }  // list capacity
  long long entries() const { return static_cast<long long>(rows()) * heads * batches; }
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
// The key-major map of the backward dK/dV variant `dkdv` for `problem` (the backward's forward),
// its memory allocated (contents not yet built). Throws Error(invalid_argument) as
// plan_block_mask, and for steps the list cannot name (query tiles or a GQA group past 2^16).
BlockMaskData plan_backward_block_mask(const Engine& engine, const Variant& dkdv,
                                       const ForwardProblem& problem,
                                       const BlockMaskOptions& options);
// Points a launch's params at the map.
void use_block_mask(FmhaParams& params, const BlockMaskData& mask);
// Throws Error(invalid_argument) unless the mask was built for this problem (family: the forced
// one, if any), by create_block_mask.
void check_block_mask(const BlockMaskData& mask, const ForwardProblem& problem,
                      const std::optional<std::string>& family);
// The same for a backward's (BackwardOptions::block_mask): made by create_backward_block_mask for
// this problem, and for the dK/dV and dQ-finishing variants `dkdv` and `finish` it runs.
void check_backward_block_mask(const BlockMaskData& mask, const ForwardProblem& problem,
                               const Variant& dkdv, const Variant& finish);

}  // namespace flashjit::detail

#include "api/block_mask.hpp"

#include <fmt/format.h>

#include <climits>

#include "families/registry.hpp"

namespace flashjit {

struct BlockMask::Impl : detail::BlockMaskData {};

BlockMask::BlockMask(std::unique_ptr<Impl> impl) : impl_(std::move(impl)) {}
BlockMask::BlockMask(BlockMask&&) noexcept = default;
BlockMask& BlockMask::operator=(BlockMask&&) noexcept = default;
BlockMask::~BlockMask() = default;

const Variant& BlockMask::variant() const { return impl_->variant; }
bool BlockMask::backward() const { return impl_->backward; }
int BlockMask::query_tiles() const { return impl_->query_tiles; }
int BlockMask::key_tiles() const { return impl_->key_tiles; }
std::size_t BlockMask::device_bytes() const {
  std::size_t bytes = impl_->memory ? impl_->memory->size() : 0;
  if (impl_->dq && impl_->dq->memory) bytes += impl_->dq->memory->size();
  return bytes;
}

namespace {

BlockMask::Counts counts_of(const detail::BlockMaskData& map) {
  BlockMask::Counts counts;
  const long long entries = map.entries();
  if (entries == 0 || !map.memory) return counts;
  std::vector<int> host(static_cast<std::size_t>(kBlockCounts * entries));
  map.memory->download(host.data(), host.size() * sizeof(int));  // synchronous
  for (long long e = 0; e < entries; ++e) {
    counts.full += host[kBlockCounts * e];
    counts.partial += host[kBlockCounts * e + 1];
    counts.total += host[kBlockCounts * e + 2];
  }
  return counts;
}

}  // namespace

BlockMask::Counts BlockMask::counts() const { return counts_of(*impl_); }
BlockMask::Counts BlockMask::dq_counts() const {
  return impl_->dq ? counts_of(*impl_->dq) : Counts{};
}

}  // namespace flashjit

namespace flashjit::detail {
namespace {

constexpr const char* kShapeFields[MaskedShape::kFields] = {
    "batch",        "heads_q",       "seqlen_q (max_seqlen_q)", "seqlen_k (max_seqlen_k)",
    "total_q",      "total_k",       "varlen",                  "paged",
    "causal",       "window",        "window_left",             "window_right",
    "sink_tokens",  "page_size"};
constexpr std::size_t kAlignment = 256;

}  // namespace

MaskedShape MaskedShape::of(const ForwardProblem& problem) {
  const FmhaParams& p = problem.params;
  MaskedShape shape;
  shape.values = {problem.batch,    problem.heads_q,  problem.seqlen_q, problem.seqlen_k,
                  problem.total_q,  problem.total_k,  problem.varlen,   problem.paged,
                  problem.causal,   problem.window,   p.window_left,    p.window_right,
                  p.sink_tokens,    problem.page_size};
  shape.lengths = {p.cu_seqlens_q, p.cu_seqlens_k, p.seqused_k};
  shape.user_functions = std::string(problem.user_functions);
  return shape;
}

std::string MaskedShape::difference(const MaskedShape& forward) const {
  for (int i = 0; i < kFields; ++i)
    if (values[i] != forward.values[i])
      return fmt::format("{} is {}: the block mask was built for {}", kShapeFields[i],
                         forward.values[i], values[i]);
  constexpr const char* kLengths[] = {"cu_seqlens_q", "cu_seqlens_k", "seqused_k"};
  for (int i = 0; i < 3; ++i)
    if (lengths[i] != forward.lengths[i])
      return fmt::format("{} is {}: the block mask was built for {}", kLengths[i],
                         forward.lengths[i], lengths[i]);
  if (user_functions != forward.user_functions)
    return fmt::format("user_functions has hash {}: the block mask was built for {}",
                       forward.user_functions, user_functions);
  return {};
}

const int* BlockMaskData::counts() const {
  return memory ? static_cast<const int*>(memory->data()) : nullptr;
}
const int* BlockMaskData::tiles() const {
  return memory ? reinterpret_cast<const int*>(static_cast<const std::byte*>(memory->data()) +
                                               tiles_offset)
                : nullptr;
}

const BlockMaskData& BlockMaskAccess::data(const BlockMask& mask) { return *mask.impl_; }

BlockMask BlockMaskAccess::make(BlockMaskData data) {
  auto impl = std::make_unique<BlockMask::Impl>();
  static_cast<BlockMaskData&>(*impl) = std::move(data);
  return BlockMask(std::move(impl));
}

namespace {

// Device memory for the map's counts, then (aligned) its lists; none for an empty map, which the
// kernels read as no map.
void allocate(const Engine& engine, BlockMaskData& mask) {
  const long long entries = mask.entries();
  if (entries == 0 || mask.slots() == 0) return;
  const std::size_t counts_bytes = static_cast<std::size_t>(entries) * kBlockCounts * sizeof(int);
  mask.tiles_offset = (counts_bytes + kAlignment - 1) / kAlignment * kAlignment;
  mask.memory.emplace(engine, mask.tiles_offset + static_cast<std::size_t>(entries) *
                                                      mask.slots() * sizeof(int));
}

}  // namespace

namespace {

// What the forward's and the backward's maps share: one entry per (tile of `variant` along the
// map's rows, head, batch), a head or batch count of 1 where the options share the map, checked
// against the grid's limits. `function` and `heads_name` word the errors.
BlockMaskData sized_map(const char* function, const Variant& variant,
                        const ForwardProblem& problem, const BlockMaskOptions& options,
                        int heads, const char* heads_name) {
  if (options.same_for_all_batches && problem.per_sequence_lengths())
    throw Error(ErrorCode::invalid_argument,
                fmt::format("{}: same_for_all_batches with per-sequence lengths: expected "
                            "false, sequences of different lengths have maps of their own",
                            function));
  BlockMaskData mask;
  mask.variant = variant;
  mask.shape = MaskedShape::of(problem);
  mask.query_tiles = (problem.seqlen_q + variant.tile_m - 1) / variant.tile_m;
  mask.key_tiles = (problem.seqlen_k + variant.tile_n - 1) / variant.tile_n;
  mask.heads = options.same_for_all_heads ? 1 : heads;
  mask.shared_heads = options.same_for_all_heads;
  mask.batches = options.same_for_all_batches ? 1 : problem.batch;
  if (mask.heads > 65535 || mask.batches > 65535)
    throw Error(ErrorCode::invalid_argument,
                fmt::format("{}: {} {} and {} batches in the map: expected at most 65535 each "
                            "(set same_for_all_heads / same_for_all_batches)",
                            function, mask.heads, heads_name, mask.batches));
  return mask;
}

}  // namespace

BlockMaskData plan_block_mask(const Engine& engine, const Variant& attention,
                              const ForwardProblem& problem, const BlockMaskOptions& options) {
  BlockMaskData mask = sized_map("create_block_mask", attention, problem, options,
                                 problem.heads_q, "heads");
  allocate(engine, mask);
  return mask;
}

BlockMaskData plan_backward_block_mask(const Engine& engine, const Variant& dkdv,
                                       const ForwardProblem& problem,
                                       const BlockMaskOptions& options) {
  BlockMaskData mask = sized_map("create_backward_block_mask", dkdv, problem, options,
                                 problem.heads_kv, "KV heads");
  mask.backward = true;
  mask.heads_kv = problem.heads_kv;
  mask.group = problem.heads_kv > 0 ? problem.heads_q / problem.heads_kv : 1;
  // A step is head_in_group << 16 | query tile, its sign bit the partial flag.
  if (mask.query_tiles > 65535 || mask.group > 32767)
    throw Error(ErrorCode::invalid_argument,
                fmt::format("create_backward_block_mask: {} query tiles of {} rows and a GQA "
                            "group of {} heads: expected at most 65535 tiles and 32767 heads",
                            mask.query_tiles, dkdv.tile_m, mask.group));
  allocate(engine, mask);
  return mask;
}

void use_block_mask(FmhaParams& p, const BlockMaskData& mask) {
  p.block_counts = mask.counts();
  p.block_tiles = mask.tiles();
  p.block_stride_b = mask.batches == 1 ? 0 : static_cast<long long>(mask.heads) * mask.rows();
  // 0 marks a map shared by every head (the backward's builder evaluates it at head 0).
  p.block_stride_h = mask.shared_heads ? 0 : mask.rows();
  p.block_key_tiles = mask.slots();
}

void check_block_mask(const BlockMaskData& mask, const ForwardProblem& problem,
                      const std::optional<std::string>& family) {
  if (mask.backward)
    throw Error(ErrorCode::invalid_argument,
                fmt::format("options.block_mask was made by create_backward_block_mask for the "
                            "backward {}: expected one from create_block_mask for this forward",
                            mask.variant.name()));
  if (std::string why = mask.shape.difference(MaskedShape::of(problem)); !why.empty())
    throw Error(ErrorCode::invalid_argument,
                fmt::format("options.block_mask does not fit this forward: {}", why));
  if (family && *family != mask.variant.family)
    throw Error(ErrorCode::invalid_argument,
                fmt::format("options.family is {}: the block mask was built for family {}",
                            *family, mask.variant.family));
}

void check_backward_block_mask(const BlockMaskData& mask, const ForwardProblem& problem,
                               const Variant& dkdv, const Variant& finish) {
  if (!mask.backward)
    throw Error(ErrorCode::invalid_argument,
                fmt::format("options.block_mask was made by create_block_mask for the forward {}: "
                            "expected one from create_backward_block_mask for this backward",
                            mask.variant.name()));
  if (std::string why = mask.shape.difference(MaskedShape::of(problem)); !why.empty())
    throw Error(ErrorCode::invalid_argument,
                fmt::format("options.block_mask does not fit this backward: {}", why));
  if (mask.heads_kv != problem.heads_kv)
    throw Error(ErrorCode::invalid_argument,
                fmt::format("options.block_mask does not fit this backward: heads_kv is {}: the "
                            "block mask was built for {}",
                            problem.heads_kv, mask.heads_kv));
  if (!(mask.variant == dkdv))
    throw Error(ErrorCode::invalid_argument,
                fmt::format("options.block_mask was built for {}: this backward runs {} "
                            "(build it with the same family, tiles and deterministic)",
                            mask.variant.name(), dkdv.name()));
  const bool dq_kernel = family_named(finish.family, "family").role == FamilyRole::backward_dq;
  if (dq_kernel != (mask.dq != nullptr) || (dq_kernel && !(mask.dq->variant == finish)))
    throw Error(ErrorCode::invalid_argument,
                fmt::format("options.block_mask was built for {} after {}: this backward runs {}",
                            mask.dq ? mask.dq->variant.name() : std::string("no dQ kernel"),
                            mask.variant.name(), finish.name()));
}

}  // namespace flashjit::detail

// Backward's host side with no GPU: bad arguments are rejected naming the argument, the workspace
// is sized by the kernels chosen (and the mode), the dK/dV variant comes from the tile table or the
// caller, and the finishing dQ kernel from the dK/dV family.
#include <doctest/doctest.h>
#include <fmt/format.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <string>
#include <vector>

#include "api/backward_kernels.hpp"
#include "api/block_mask.hpp"
#include "api/validate_backward.hpp"
#include "bwd_rows/shape.cuh"
#include "bwd_wgmma/shape.cuh"
#include "common/bwd_workspace.cuh"
#include "families/block_mask/block_mask.hpp"
#include "families/registry.hpp"
#include "flashjit/flashjit.hpp"

using namespace flashjit;

namespace {

void* fake(std::uintptr_t address) { return reinterpret_cast<void*>(address); }

// A GQA 4:1 backward with seqlen_q != seqlen_k; addresses are never dereferenced.
struct BackwardArgs {
  TensorView q = TensorView::bshd(fake(0x100000), DType::bf16, 2, 100, 8, 128);
  TensorView k = TensorView::bshd(fake(0x200000), DType::bf16, 2, 300, 2, 128);
  TensorView v = TensorView::bshd(fake(0x300000), DType::bf16, 2, 300, 2, 128);
  TensorView out = TensorView::bshd(fake(0x400000), DType::bf16, 2, 100, 8, 128);
  TensorView dout = TensorView::bshd(fake(0x500000), DType::bf16, 2, 100, 8, 128);
  const float* lse = static_cast<const float*>(fake(0x600000));
  TensorView dq = TensorView::bshd(fake(0x700000), DType::bf16, 2, 100, 8, 128);
  TensorView dk = TensorView::bshd(fake(0x800000), DType::bf16, 2, 300, 2, 128);
  TensorView dv = TensorView::bshd(fake(0x900000), DType::bf16, 2, 300, 2, 128);
  BackwardOptions options;

  detail::BackwardProblem validate() const {
    return detail::validate_backward(q, k, v, out, dout, lse, dq, dk, dv, nullptr, options);
  }
};

std::string rejection(const BackwardArgs& args) {
  try {
    args.validate();
  } catch (const Error& e) {
    CHECK(e.code() == ErrorCode::invalid_argument);
    return e.what();
  }
  return "accepted";
}

DeviceInfo device_of(const char* arch) {
  DeviceInfo d;
  d.arch = arch;
  return d;
}

}  // namespace

TEST_CASE("backward arguments are checked before any launch, naming the argument") {
  CHECK(rejection(BackwardArgs{}) == "accepted");
  BackwardArgs a;
  a.lse = nullptr;
  CHECK(rejection(a).find("lse is null") != std::string::npos);
  BackwardArgs b;
  b.dq = TensorView::bshd(fake(0x700000), DType::bf16, 2, 101, 8, 128);
  CHECK(rejection(b).find("dq.shape[1] (seqlen) is 101: expected 100 (the shape of q)") !=
        std::string::npos);
  BackwardArgs c;
  c.dk = TensorView::bshd(fake(0x800000), DType::bf16, 2, 300, 8, 128);
  CHECK(rejection(c).find("dk.shape[2] (heads) is 8: expected 2 (the shape of k)") !=
        std::string::npos);
  BackwardArgs d;
  d.dout.dtype = DType::fp16;
  CHECK(rejection(d).find("dout.dtype is fp16") != std::string::npos);
  BackwardArgs e;
  e.dv.data = nullptr;
  CHECK(rejection(e).find("dv.data is null") != std::string::npos);
  BackwardArgs f;
  f.lse = static_cast<const float*>(fake(0x600002));
  CHECK(rejection(f).find("lse is not 4-byte aligned") != std::string::npos);
  BackwardArgs g;
  g.options.softmax_scale = -1.f;
  CHECK(rejection(g).find("softmax_scale is -1") != std::string::npos);
  BackwardArgs h;
  h.options.workspace = fake(0x100010);
  CHECK(rejection(h).find("options.workspace") != std::string::npos);
  BackwardArgs i;  // the forward's own checks hold too: heads_q a multiple of heads_kv
  i.q = i.out = i.dout = i.dq = TensorView::bshd(fake(0x100000), DType::bf16, 2, 100, 7, 128);
  CHECK(rejection(i).find("not a multiple of k/v heads") != std::string::npos);
  // Views whose strides overlap pass the view checks at any size (outputs may not overlap, but
  // the workspace query takes q alone), and the workspace (one fp32 accumulator row per query row
  // and head) would pass 2^64 bytes (fuzz_backward_args found it).
  TensorView huge{fake(0x100000), DType::bf16, {65535, 1073741696, 65535, 128}, {8, 8, 8, 1}};
  const auto kv = TensorView::bshd(fake(0x200000), DType::bf16, 65535, 16, 1, 128);
  auto query = [&](const TensorView& q) -> std::string {
    try {
      return std::to_string(detail::validate_backward(q, kv, kv, nullptr, {}).workspace_bytes());
    } catch (const Error& e) {
      CHECK(e.code() == ErrorCode::invalid_argument);
      return e.what();
    }
  };
  CHECK(query(huge).find("fp32 values: expected at most 2^62 bytes") != std::string::npos);
  huge.shape[1] = 1000;  // 65535 x 65535 x 1024 rows x 128 floats: 2^51 bytes, accepted
  CHECK(query(huge).find("expected") == std::string::npos);
  // An output whose elements share memory would be written twice: refused, naming it.
  BackwardArgs overlap;
  overlap.dq.stride = {100 * 8 * 128, 8 * 128, 64, 1};  // heads 64 apart, 128 wide
  CHECK(rejection(overlap).find("dq: shape 2 x 100 x 8 x 128 with strides 102400, 1024, 64, 1 "
                                "has elements that share memory (heads stride 64 < 128") !=
        std::string::npos);
  BackwardArgs transposed;  // BHSD gradients with BSHD inputs: no overlap
  transposed.dk = TensorView::bhsd(fake(0x800000), DType::bf16, 2, 300, 2, 128);
  CHECK(rejection(transposed) == "accepted");
}

// The dK/dV launch's tile counter: one int, in its own 256-byte slot after the row terms.
constexpr long long kCounterSlot = 256;

TEST_CASE("the backward workspace holds the row terms, the tile counter, and before dispatch the dQ accumulator unless deterministic") {
  BackwardArgs args;
  const detail::BackwardProblem atomic = args.validate();
  const long long rows = 2LL * 8 * BwdWorkspaceRows::padded_rows(100);
  CHECK(atomic.params.seqlen_rows == 128);
  CHECK(atomic.params.tile_counter == nullptr);  // set with the workspace
  CHECK(atomic.workspace_bytes() == 2 * (rows * 4) + kCounterSlot + rows * 128 * 4);
  args.options.deterministic = true;
  const detail::BackwardProblem exact = args.validate();
  CHECK(exact.workspace_bytes() == 2 * (rows * 4) + kCounterSlot);
  const BackwardParams p = exact.with_workspace(fake(0x1000000));
  CHECK(p.dq_accum == nullptr);
  CHECK(reinterpret_cast<std::uintptr_t>(p.lse_log2) - 0x1000000 == rows * 4);
  CHECK(reinterpret_cast<std::uintptr_t>(p.tile_counter) - 0x1000000 == 2 * rows * 4);
  const BackwardParams q = atomic.with_workspace(fake(0x1000000));
  CHECK(reinterpret_cast<std::uintptr_t>(q.tile_counter) - 0x1000000 == 2 * rows * 4);
  CHECK(reinterpret_cast<std::uintptr_t>(q.dq_accum) - 0x1000000 == 2 * rows * 4 + kCounterSlot);
  // The three-view form sizes the same workspace.
  CHECK(detail::validate_backward(args.q, args.k, args.v, nullptr, args.options).workspace_bytes() ==
        exact.workspace_bytes());
}

TEST_CASE("the fused kernel's dQ accumulator: 64 x 64 blocks in a wgmma accumulator's register order") {
  // bwd_wgmma_fused stores warp w's lane l's float4 i at 1024 w + 128 i + 4 l of its block, and
  // bwd_convert reads (row, column) through BwdDqBlocks::offset: both must name the same float.
  // In an m64n64 fp32 accumulator lane l of warp w holds element 4 i + 2 h + b at row
  // 16 w + 8 h + l / 4, column 8 i + 2 (l % 4) + b.
  for (const int head_dim : {64, 128, 256}) {
    const long long rows = 256;
    std::vector<int> seen(static_cast<std::size_t>(rows * head_dim), 0);
    long long outside = 0;
    for (long long row = 0; row < rows; ++row)
      for (int col = 0; col < head_dim; ++col) {
        const long long at = BwdDqBlocks::offset(row, col, head_dim);
        if (at < 0 || at >= rows * head_dim)
          ++outside;
        else
          ++seen[static_cast<std::size_t>(at)];
      }
    CHECK(outside == 0);
    CHECK(std::count(seen.begin(), seen.end(), 1) == rows * head_dim);  // a permutation
    for (int w = 0; w < 4; ++w)
      for (int lane = 0; lane < 32; ++lane)
        for (int e = 0; e < 32; ++e) {
          const int i = e / 4, h = e % 4 / 2, b = e % 2;
          const long long row = 64 + 16 * w + 8 * h + lane / 4;  // the second row block
          const int col = 64 + 8 * i + 2 * (lane % 4) + b;       // the second column block
          if (col >= head_dim) continue;
          const long long block = (row / 64) * (head_dim / 64) + col / 64;
          CHECK(BwdDqBlocks::offset(row, col, head_dim) ==
                block * BwdDqBlocks::kFloats + 1024 * w + 128 * i + 4 * lane + e % 4);
        }
  }
}

TEST_CASE("bwd_convert reads each float of a fused dQ block once, as the row and column it is") {
  // A CTA per 64 x 64 block, 256 threads of 16 floats: float 4 q + 2 h + b of thread t's run is
  // row convert_row(t) + 8 h, column convert_column(t) + 2 q + b.
  static_assert(BwdRowsShape::kThreads * 16 == BwdDqBlocks::kFloats);
  for (const int head_dim : {64, 128, 256})
    for (const long long row0 : {0LL, 64LL, 192LL})
      for (int col0 = 0; col0 < head_dim; col0 += 64) {
        const long long block = BwdDqBlocks::offset(row0, col0, head_dim);
        CHECK(block % BwdDqBlocks::kFloats == 0);
        std::vector<int> seen(BwdDqBlocks::kFloats, 0);
        int wrong = 0;
        for (int t = 0; t < BwdRowsShape::kThreads; ++t)
          for (int e = 0; e < 16; ++e) {
            const int q = e / 4, h = e % 4 / 2, b = e % 2;
            const long long at = BwdDqBlocks::offset(row0 + BwdRowsShape::convert_row(t) + 8 * h,
                                                     col0 + BwdRowsShape::convert_column(t) +
                                                         2 * q + b,
                                                     head_dim);
            if (at != block + BwdRowsShape::convert_run(t) + e) ++wrong;
            if (at >= block && at < block + BwdDqBlocks::kFloats)
              ++seen[static_cast<std::size_t>(at - block)];
          }
        CHECK(wrong == 0);
        CHECK(std::count(seen.begin(), seen.end(), 1) == BwdDqBlocks::kFloats);
      }
}

TEST_CASE("the row passes' CTAs: whole groups of padded rows, every column of a row") {
  for (const int head_dim : {32, 64, 96, 128, 192, 256}) {
    const int lanes = BwdRowsShape::prep_lanes(head_dim);
    CAPTURE(head_dim);
    CHECK(lanes * BwdRowsShape::kVectorElements >= head_dim);
    CHECK(lanes * BwdRowsShape::kVectorElements < 2 * head_dim);
    CHECK((lanes & (lanes - 1)) == 0);
    CHECK(lanes <= 32);
    CHECK(BwdWorkspaceRows::kRowQuantum % BwdRowsShape::prep_rows(head_dim) == 0);
    CHECK(BwdRowsShape::convert_column_blocks(head_dim) * BwdRowsShape::kConvertSide >= head_dim);
  }
}

TEST_CASE("causal dK/dV grids: every (key tile, pair) once, heaviest tiles first in each group") {
  for (const int tiles : {1, 3, 4, 64, 128})
    for (const int pairs : {1, 2, 3, 4, 5, 16, 33}) {
      CAPTURE(tiles);
      CAPTURE(pairs);
      std::vector<int> seen(static_cast<std::size_t>(tiles * pairs), 0);
      int out_of_order = 0, previous_tile = 0, previous_group = 0;
      for (int linear = 0; linear < tiles * pairs; ++linear) {
        const GroupedTile at = BwdKeyTileOrder::causal(linear, tiles, pairs);
        REQUIRE(at.rank >= 0);
        REQUIRE(at.rank < tiles);
        REQUIRE(at.pair >= 0);
        REQUIRE(at.pair < pairs);
        ++seen[static_cast<std::size_t>(at.pair * tiles + at.rank)];
        const int group = at.pair / BwdKeyTileOrder::kGroup;
        if (group == previous_group && at.rank < previous_tile) ++out_of_order;
        CHECK(group >= previous_group);  // groups one after another
        previous_tile = at.rank;
        previous_group = group;
      }
      CHECK(std::count(seen.begin(), seen.end(), 1) == tiles * pairs);
      CHECK(out_of_order == 0);
    }
}

TEST_CASE("the dK/dV variant comes from the tile table, or the caller's family and tiles") {
  BackwardArgs args;
  args.options.causal = true;
  const detail::BackwardProblem problem = args.validate();
  // Hopper: the fused wgmma backward (dQ by bulk reductions, finished by bwd_convert); in the
  // deterministic mode the wgmma dK/dV kernel and its own dQ kernel (below).
  const Variant chosen = detail::select_backward_variant(problem, device_of("sm_90a"), args.options);
  CHECK(chosen.name() == "bwd_wgmma_fused.sm90a.bf16.d128.m64n128s2.causal");
  CHECK(detail::backward_finish_variant(problem, chosen).name() ==
        "bwd_convert.sm90a.bf16.d128.m8n1s1");
  // Earlier GPUs: mma.sync, dQ by atomics finished by bwd_convert, or deterministic its dQ kernel.
  const Variant ampere = detail::select_backward_variant(problem, device_of("sm_80"), args.options);
  CHECK(ampere.name() == "bwd_mma.sm80.bf16.d128.m64n128s2.causal");
  CHECK(detail::backward_finish_variant(problem, ampere).name() ==
        "bwd_convert.sm80.bf16.d128.m8n1s1");
  // Head dims bwd_wgmma has no kernel for fall back to bwd_mma on Hopper too.
  BackwardArgs d96 = args;
  d96.q = d96.out = d96.dout = d96.dq = TensorView::bshd(fake(0x100000), DType::bf16, 2, 100, 8, 96);
  d96.k = d96.v = d96.dk = d96.dv = TensorView::bshd(fake(0x200000), DType::bf16, 2, 300, 2, 96);
  CHECK(detail::select_backward_variant(d96.validate(), device_of("sm_90a"), d96.options).family ==
        "bwd_mma");
  args.options.deterministic = true;
  const detail::BackwardProblem exact = args.validate();
  const Variant repeatable = detail::select_backward_variant(exact, device_of("sm_90a"), args.options);
  CHECK(repeatable.name() == "bwd_wgmma.sm90a.bf16.d128.m64n128s2.causal");
  CHECK(detail::backward_finish_variant(exact, repeatable).name() ==
        "bwd_wgmma_dq.sm90a.bf16.d128.m128n64s2.causal");
  // The fused family, forced, refuses the deterministic mode, and shapes it cannot build.
  args.options.family = "bwd_wgmma_fused";
  CHECK_THROWS_WITH_AS(detail::select_backward_variant(exact, device_of("sm_90a"), args.options),
                       doctest::Contains("options.family bwd_wgmma_fused adds dQ up with atomics: "
                                         "not deterministic"),
                       Error);
  args.options.tiles = TileConfig{64, 64, 2};
  CHECK_THROWS_WITH_AS(detail::select_backward_variant(problem, device_of("sm_90a"), args.options),
                       doctest::Contains("expected tile_n 128 (two consumers of 64 keys) and "
                                         "tile_m 64"),
                       Error);
  args.options.tiles.reset();
  CHECK(detail::backward_finish_variant(exact, ampere).name() ==
        "bwd_mma_dq.sm80.bf16.d128.m64n64s2.causal");
  // bwd_mma stays the forced family's choice on Hopper.
  args.options.family = "bwd_mma";
  const Variant forced = detail::select_backward_variant(exact, device_of("sm_90a"), args.options);
  CHECK(forced.name() == "bwd_mma.sm90a.bf16.d128.m64n128s2.causal");
  CHECK(detail::backward_finish_variant(exact, forced).name() ==
        "bwd_mma_dq.sm90a.bf16.d128.m64n64s2.causal");
  args.options.family = "bwd_wgmma";  // Hopper's alone
  CHECK_THROWS_WITH_AS(detail::select_backward_variant(exact, device_of("sm_80"), args.options),
                       doctest::Contains("options.family bwd_wgmma has no kernel for head_dim 128 "
                                         "on sm_80"),
                       Error);
  args.options.family.reset();

  args.options.tiles = TileConfig{64, 64, 1};
  CHECK(detail::select_backward_variant(problem, device_of("sm_86"), args.options).name() ==
        "bwd_mma.sm86.bf16.d128.m64n64s1.causal");
  CHECK(detail::select_backward_variant(problem, device_of("sm_90a"), args.options).name() ==
        "bwd_wgmma.sm90a.bf16.d128.m64n64s1.causal");
  args.options.tiles = TileConfig{64, 48, 1};
  CHECK_THROWS_WITH_AS(detail::select_backward_variant(problem, device_of("sm_86"), args.options),
                       doctest::Contains("tile_n 48 must be 16, 32, 64 or 128"), Error);
  CHECK_THROWS_WITH_AS(detail::select_backward_variant(problem, device_of("sm_90a"), args.options),
                       doctest::Contains("tile_n 48 at head_dim 128 must be 64 or 128"), Error);
  args.options.tiles = TileConfig{64, 128, 1};
  CHECK_THROWS_WITH_AS(  // two consumers sharing 64 keys at d256: 128 keys would take four
      [&] {
        BackwardArgs d256 = args;
        d256.q = d256.out = d256.dout = d256.dq =
            TensorView::bshd(fake(0x100000), DType::bf16, 2, 100, 8, 256);
        d256.k = d256.v = d256.dk = d256.dv =
            TensorView::bshd(fake(0x200000), DType::bf16, 2, 300, 2, 256);
        detail::select_backward_variant(d256.validate(), device_of("sm_90a"), d256.options);
      }(),
      doctest::Contains("tile_n 128 at head_dim 256 must be 64"), Error);
  args.options.tiles.reset();
  args.options.family = "mma";
  CHECK_THROWS_WITH_AS(detail::select_backward_variant(problem, device_of("sm_90a"), args.options),
                       doctest::Contains("options.family 'mma' is not a backward dK/dV family: "
                                         "expected one of bwd_wgmma_fused, bwd_wgmma, bwd_mma"),
                       Error);
}

TEST_CASE("a warm backward's plans are keyed by every layout and option its launches read, and by no pointer") {
  const BackwardArgs base;
  auto key_of = [](const BackwardArgs& args, const detail::KernelFamily* forced = nullptr) {
    return detail::BackwardPlanKey::of(nullptr, args.validate(), args.options, forced);
  };
  const detail::BackwardPlanKey key = key_of(base);
  CHECK(key_of(base) == key);

  BackwardArgs moved;  // other buffers, the same layouts: the same plans (maps are re-addressed)
  for (TensorView* view : {&moved.q, &moved.k, &moved.v, &moved.out, &moved.dout, &moved.dq,
                           &moved.dk, &moved.dv})
    view->data = fake(reinterpret_cast<std::uintptr_t>(view->data) + 0x10000000);
  moved.lse = static_cast<const float*>(fake(0x6000000));
  moved.options.softmax_scale = 0.25f;
  moved.options.workspace = fake(0x20000000);
  moved.options.workspace_bytes = std::size_t{1} << 30;
  CHECK(key_of(moved) == key);

  // dO's layout: its tensor map is part of the plan.
  BackwardArgs bhsd = base;
  bhsd.dout = TensorView::bhsd(fake(0x500000), DType::bf16, 2, 100, 8, 128);
  CHECK_FALSE(key_of(bhsd) == key);
  // The forward's layouts, shapes and variants key it as they key a forward.
  BackwardArgs k_bhsd = base;
  k_bhsd.k = TensorView::bhsd(fake(0x200000), DType::bf16, 2, 300, 2, 128);
  CHECK_FALSE(key_of(k_bhsd) == key);
  BackwardArgs causal = base;
  causal.options.causal = true;
  CHECK_FALSE(key_of(causal) == key);
  BackwardArgs tiled = base;
  tiled.options.tiles = TileConfig{64, 128, 2};
  CHECK_FALSE(key_of(tiled) == key);
  CHECK_FALSE(key_of(base, detail::find_family("bwd_wgmma")) == key);
  CHECK_FALSE(detail::BackwardPlanKey::of(reinterpret_cast<CUcontext>(0x10), base.validate(),
                                          base.options, nullptr) == key);
  // What runs other kernels: the mode, and the sinks' gradient (bwd_sink). The sinks alone
  // change no backward kernel (the LSE holds them).
  BackwardArgs exact = base;
  exact.options.deterministic = true;
  CHECK_FALSE(key_of(exact) == key);
  BackwardArgs sunk = base;
  sunk.options.sink_logits = static_cast<const float*>(fake(0xb00000));
  CHECK(key_of(sunk) == key);
  sunk.options.d_sink_logits = static_cast<float*>(fake(0xc00000));
  CHECK_FALSE(key_of(sunk) == key);
}

TEST_CASE("the dQ accumulator is in the workspace only for kernels that sum dQ by atomics") {
  BackwardArgs args;
  const long long rows = 2LL * 8 * BwdWorkspaceRows::padded_rows(100);
  auto workspace = [&](const char* arch, bool deterministic) {
    args.options.deterministic = deterministic;
    detail::BackwardProblem problem = args.validate();
    const Variant dkdv = detail::select_backward_variant(problem, device_of(arch), args.options);
    problem.dq_accumulator =
        detail::uses_dq_accumulator(detail::backward_finish_variant(problem, dkdv));
    CHECK((problem.with_workspace(fake(0x1000000)).dq_accum != nullptr) == problem.dq_accumulator);
    return problem.workspace_bytes();
  };
  const std::size_t terms = 2 * (rows * 4) + kCounterSlot;
  CHECK(workspace("sm_80", false) == terms + rows * 128 * 4);  // bwd_mma's atomics
  CHECK(workspace("sm_80", true) == terms);                    // bwd_mma_dq
  CHECK(workspace("sm_90a", false) == terms + rows * 128 * 4);  // bwd_wgmma_fused's reductions
  CHECK(workspace("sm_90a", true) == terms);                   // bwd_wgmma_dq
  args.options.family = "bwd_wgmma";
  CHECK(workspace("sm_90a", false) == terms);                  // bwd_wgmma_dq, both modes
  args.options.family = "bwd_mma";
  CHECK(workspace("sm_90a", false) == terms + rows * 128 * 4);
}

TEST_CASE("backward families are listed and their default variants are named") {
  int backward = 0;
  for (const FamilyInfo& family : families())
    if (family.backward) {
      ++backward;
      CHECK_FALSE(family.attention);
    }
  CHECK(backward == 8);
  int bwd_variants = 0, wgmma_variants = 0;
  for (const Variant& v : default_variants("sm_90a")) {
    if (v.family.rfind("bwd_", 0) != 0) continue;
    ++bwd_variants;
    wgmma_variants += v.family.rfind("bwd_wgmma", 0) == 0;
    CHECK(Variant::parse(v.name()) == v);
    if (v.family == "bwd_prep" || v.family == "bwd_convert") CHECK_FALSE(v.causal);
  }
  // 2 dtypes x 6 head dims: dK/dV and dQ causal or not, each dense and varlen, the 3 row passes
  // once (they take either at run time); and the Hopper families' 3 head dims, dK/dV and dQ, and
  // the fused kernel's 2, causal or not, dense and varlen.
  CHECK(wgmma_variants == 2 * 2 * (3 * (2 + 2) + 2 * 2));
  CHECK(bwd_variants == 2 * 6 * (2 * (2 + 2) + 1 + 1 + 1) + wgmma_variants);
  int varlen = 0;
  for (const Variant& v : default_variants("sm_90a")) varlen += v.varlen && v.family.starts_with("bwd_");
  CHECK(varlen == (bwd_variants - 2 * 6 * 3) / 2);
  for (const Variant& v : default_variants("sm_80")) CHECK(v.family.rfind("bwd_wgmma", 0) != 0);
}

TEST_CASE("backward score variants: checked like the forward's, named, and carried to dQ") {
  auto variants = [](const BackwardArgs& args, const char* arch) {
    const detail::BackwardProblem problem = args.validate();
    const Variant dkdv = detail::select_backward_variant(problem, device_of(arch), args.options);
    return std::pair{dkdv, detail::backward_finish_variant(problem, dkdv)};
  };
  BackwardArgs a;
  a.options.causal = true;
  a.options.softcap = 30.f;
  a.options.window_left = 256;
  a.options.window_right = 0;
  a.options.sink_tokens = 4;
  a.options.alibi_slopes = static_cast<const float*>(fake(0xa00000));
  a.options.sink_logits = static_cast<const float*>(fake(0xb00000));
  a.options.d_sink_logits = static_cast<float*>(fake(0xc00000));
  const detail::BackwardProblem problem = a.validate();
  CHECK(problem.params.dsink == a.options.d_sink_logits);
  // The original scale for the chain rule, though the capped forward params carry 1.
  CHECK(problem.params.dscore_scale == doctest::Approx(1 / std::sqrt(128.f)));
  CHECK(problem.params.fwd.softmax_scale == 1.f);
  CHECK(problem.params.fwd.window_right == 0);
  {
    const auto [dkdv, finish] = variants(a, "sm_90a");
    CHECK(dkdv.name() == "bwd_wgmma_fused.sm90a.bf16.d128.m64n128s2.causal.softcap.window.alibi");
    CHECK(finish.family == "bwd_convert");
  }
  a.options.deterministic = true;  // the dQ kernels take the same variants
  CHECK(variants(a, "sm_90a").second.name() ==
        "bwd_wgmma_dq.sm90a.bf16.d128.m128n64s2.causal.softcap.window.alibi");
  const auto [mma, mma_dq] = variants(a, "sm_80");
  CHECK(mma.name().find("bwd_mma.sm80.bf16.d128.") == 0);
  CHECK(mma.name().ends_with(".causal.softcap.window.alibi"));
  CHECK(mma_dq.name().find("bwd_mma_dq.sm80.bf16.d128.") == 0);
  CHECK(mma_dq.name().ends_with(".causal.softcap.window.alibi"));

  // The forward's checks, with its argument names.
  BackwardArgs b;
  b.options.causal = true;
  b.options.window_right = 5;
  CHECK(rejection(b).find("window_right is 5 with causal") != std::string::npos);
  BackwardArgs c;
  c.options.sink_tokens = 2;
  CHECK(rejection(c).find("sink_tokens is 2 with window_left -1") != std::string::npos);
  BackwardArgs d;
  d.options.softcap = -1.f;
  CHECK(rejection(d).find("softcap is -1") != std::string::npos);
  BackwardArgs e;
  e.options.d_sink_logits = static_cast<float*>(fake(0xc00000));
  CHECK(rejection(e).find("d_sink_logits is set but sink_logits is null") != std::string::npos);
  BackwardArgs f;
  f.options.sink_logits = static_cast<const float*>(fake(0xb00000));
  f.options.d_sink_logits = static_cast<float*>(fake(0xc00002));
  CHECK(rejection(f).find("d_sink_logits is not 4-byte aligned") != std::string::npos);
  BackwardArgs g;
  g.options.alibi_slopes = static_cast<const float*>(fake(0xa00001));
  CHECK(rejection(g).find("alibi_slopes is not 4-byte aligned") != std::string::npos);
  // Sinks alone need no variant of the gradient kernels: the forward's LSE holds them.
  BackwardArgs h;
  h.options.sink_logits = static_cast<const float*>(fake(0xb00000));
  CHECK(variants(h, "sm_90a").first.name() == "bwd_wgmma_fused.sm90a.bf16.d128.m64n128s2");
}

TEST_CASE("backward user functions: named in the variants, carried to dQ; a score_mod needs its derivative") {
  const UserFunctions masking("", "__device__ bool mask_mod(int, int, int q, int k, "
                                  "const flashjit::UserArgs&) { return k <= q; }");
  const char* score = "__device__ float score_mod(float s, int, int, int, int, "
                      "const flashjit::UserArgs&) { return 2.f * s; }";
  const UserFunctions scaled(score, "");
  const UserFunctions scaled_with_grad(score, "", "__device__ float score_mod_grad(float, int, "
                                                  "int, int, int, const flashjit::UserArgs&) "
                                                  "{ return 2.f; }");
  BackwardArgs a;
  a.options.user_functions = &masking;
  a.options.user_args[0] = fake(0xd00000);
  const detail::BackwardProblem problem = a.validate();
  CHECK(problem.forward.user_functions == masking.hash());
  CHECK(problem.params.fwd.user_args.ptr[0] == fake(0xd00000));
  const Variant dkdv = detail::select_backward_variant(problem, device_of("sm_90a"), a.options);
  CHECK(dkdv.name() == "bwd_wgmma_fused.sm90a.bf16.d128.m64n128s2.user" + masking.hash());
  a.options.deterministic = true;
  const detail::BackwardProblem repeatable = a.validate();
  const Variant wgmma = detail::select_backward_variant(repeatable, device_of("sm_90a"), a.options);
  CHECK(detail::backward_finish_variant(repeatable, wgmma).name() ==
        "bwd_wgmma_dq.sm90a.bf16.d128.m128n64s2.user" + masking.hash());
  const Variant mma = detail::select_backward_variant(repeatable, device_of("sm_80"), a.options);
  CHECK(mma.name().ends_with(".user" + masking.hash()));
  CHECK(detail::backward_finish_variant(repeatable, mma).name().ends_with(".user" +
                                                                         masking.hash()));
  // Other functions, another loaded set of kernels.
  BackwardArgs b = a;
  b.options.user_functions = &scaled_with_grad;
  CHECK(detail::backward_key(nullptr, a.validate(), a.options) !=
        detail::backward_key(nullptr, b.validate(), b.options));
  // A score_mod without its derivative is refused before anything runs, naming it.
  BackwardArgs c;
  c.options.user_functions = &scaled;
  CHECK(rejection(c).find("options.user_functions (hash " + scaled.hash() +
                          ") has a score_mod but no score_mod_grad") != std::string::npos);
  // user_args without user functions: the forward's check, with its argument name.
  BackwardArgs d;
  d.options.user_args[2] = fake(0xd00000);
  CHECK(rejection(d).find("user_args[2] is set without user_functions") != std::string::npos);
}

TEST_CASE("backward block masks: refused without a mask_mod, checked against the problem and its kernels") {
  const UserFunctions masking("", "__device__ bool mask_mod(int, int, int q, int k, "
                                  "const flashjit::UserArgs&) { return k <= q; }");
  // Backward families take block masks; the key-major builder is a family of its own.
  for (const FamilyInfo& family : families())
    if (family.backward && (family.name.starts_with("bwd_wgmma") || family.name.starts_with("bwd_mma")))
      CHECK_MESSAGE(family.block_mask, family.name);
  CHECK(detail::find_family("bwd_blockmask") != nullptr);
  // A mask without a mask_mod to have built it from: refused by validation, naming it. (A
  // BlockMask needs a GPU to be made; the options only need its address here.)
  BackwardArgs a;
  const BlockMask some_mask = detail::BlockMaskAccess::make(detail::BlockMaskData{});
  a.options.block_mask = &some_mask;
  CHECK(rejection(a).find("options.block_mask is set without a mask_mod") != std::string::npos);
  a.options.user_functions = &masking;
  CHECK(rejection(a) == "accepted");

  // What create_backward_block_mask would plan for the problem (no memory: no GPU here).
  const detail::BackwardProblem problem = a.validate();
  for (bool deterministic : {false, true}) {
    CAPTURE(deterministic);
    BackwardArgs b = a;
    b.options.deterministic = deterministic;
    const detail::BackwardProblem p = b.validate();
    const Variant dkdv = detail::select_backward_variant(p, device_of("sm_90a"), b.options);
    const Variant finish = detail::backward_finish_variant(p, dkdv);
    auto planned = [&] {  // the map's fields as plan_backward_block_mask sets them
      detail::BlockMaskData map;
      map.variant = dkdv;
      map.shape = detail::MaskedShape::of(p.forward);
      map.backward = true;
      map.heads_kv = p.forward.heads_kv;
      map.group = p.forward.heads_q / p.forward.heads_kv;
      map.query_tiles = (p.forward.seqlen_q + dkdv.tile_m - 1) / dkdv.tile_m;
      map.key_tiles = (p.forward.seqlen_k + dkdv.tile_n - 1) / dkdv.tile_n;
      map.heads = p.forward.heads_kv;
      map.batches = p.forward.batch;
      if (deterministic) {  // bwd_wgmma + bwd_wgmma_dq: a dQ map too
        auto dq_map = std::make_shared<detail::BlockMaskData>();
        dq_map->variant = finish;
        map.dq = dq_map;
      }
      return map;
    };
    CHECK(finish.family == (deterministic ? "bwd_wgmma_dq" : "bwd_convert"));
    const detail::BlockMaskData map = planned();
    CHECK_NOTHROW(detail::check_backward_block_mask(map, p.forward, dkdv, finish));
    // Key-major: an entry per (batch, KV head, key tile), group x query tiles steps each.
    FmhaParams params{};
    detail::use_block_mask(params, map);
    CHECK(params.block_stride_h == map.key_tiles);
    CHECK(params.block_stride_b == static_cast<long long>(map.key_tiles) * 2);
    CHECK(params.block_key_tiles == 4 * map.query_tiles);
    auto refusal = [&](const detail::BlockMaskData& m, const Variant& d, const Variant& f,
                       const detail::ForwardProblem& fp) {
      try {
        detail::check_backward_block_mask(m, fp, d, f);
      } catch (const Error& e) {
        CHECK(e.code() == ErrorCode::invalid_argument);
        return std::string(e.what());
      }
      return std::string("accepted");
    };
    // Other kernels (a forced family or tiles, the other mode) are named.
    Variant other = dkdv;
    other.tile_n = 64;
    CHECK(refusal(map, other, finish, p.forward)
              .find("options.block_mask was built for " + dkdv.name() + ": this backward runs " +
                    other.name()) != std::string::npos);
    detail::BlockMaskData other_dq = planned();
    if (deterministic)
      other_dq.dq = nullptr;
    else
      other_dq.dq = std::make_shared<const detail::BlockMaskData>();
    CHECK(refusal(other_dq, dkdv, finish, p.forward).find("this backward runs " + finish.name()) !=
          std::string::npos);
    // Another problem: its causal mask, its KV heads.
    BackwardArgs c = b;
    c.options.causal = true;
    CHECK(refusal(map, dkdv, finish, c.validate().forward)
              .find("does not fit this backward: causal is 1: the block mask was built for 0") !=
          std::string::npos);
    detail::ForwardProblem mqa = p.forward;
    mqa.heads_kv = 1;
    CHECK(refusal(map, dkdv, finish, mqa).find("heads_kv is 1: the block mask was built for 2") !=
          std::string::npos);
    // A backward's map is not a forward's, nor the other way round.
    CHECK_THROWS_WITH_AS(detail::check_block_mask(map, p.forward, std::nullopt),
                         doctest::Contains("made by create_backward_block_mask"), Error);
    detail::BlockMaskData forward_map = planned();
    forward_map.backward = false;
    CHECK(refusal(forward_map, dkdv, finish, p.forward)
              .find("made by create_block_mask for the forward") != std::string::npos);
  }
  // The builder of the key-major map copies the dK/dV variant's tiles and masks.
  const Variant dkdv = detail::select_backward_variant(problem, device_of("sm_90a"), a.options);
  const Variant builder = detail::backward_block_mask_variant(dkdv);
  CHECK(builder.name() == fmt::format("bwd_blockmask.sm90a.bf16.d64.m{}n{}s1.user{}", dkdv.tile_m,
                                      dkdv.tile_n, masking.hash()));
  CHECK(Variant::parse(builder.name()) == builder);
}

namespace {

// A varlen batch of 3 sequences: q [1, 250, 8, 128], k [1, 700, 2, 128]; cu_seqlens are device
// pointers the host never reads.
struct VarlenBackwardArgs {
  TensorView q = TensorView::bshd(fake(0x100000), DType::bf16, 1, 250, 8, 128);
  TensorView k = TensorView::bshd(fake(0x200000), DType::bf16, 1, 700, 2, 128);
  TensorView v = TensorView::bshd(fake(0x300000), DType::bf16, 1, 700, 2, 128);
  TensorView out = TensorView::bshd(fake(0x400000), DType::bf16, 1, 250, 8, 128);
  TensorView dout = TensorView::bshd(fake(0x500000), DType::bf16, 1, 250, 8, 128);
  const float* lse = static_cast<const float*>(fake(0x600000));
  TensorView dq = TensorView::bshd(fake(0x700000), DType::bf16, 1, 250, 8, 128);
  TensorView dk = TensorView::bshd(fake(0x800000), DType::bf16, 1, 700, 2, 128);
  TensorView dv = TensorView::bshd(fake(0x900000), DType::bf16, 1, 700, 2, 128);
  VarlenBatch varlen{static_cast<const std::int32_t*>(fake(0xa00000)),
                     static_cast<const std::int32_t*>(fake(0xb00000)), 3, 200, 400};
  BackwardOptions options;

  detail::BackwardProblem validate() const {
    return detail::validate_backward(q, k, v, out, dout, lse, dq, dk, dv, &varlen, options);
  }
  std::string rejection() const {
    try {
      validate();
    } catch (const Error& e) {
      CHECK(e.code() == ErrorCode::invalid_argument);
      return e.what();
    }
    return "accepted";
  }
};

}  // namespace

TEST_CASE("varlen backward: packed views checked as the forward's, workspace rows per sequence") {
  VarlenBackwardArgs args;
  CHECK(args.rejection() == "accepted");
  const detail::BackwardProblem problem = args.validate();
  CHECK(problem.forward.varlen);
  // Each sequence padded to 128 rows before the next: total_q + batch * 128, rounded up.
  CHECK(problem.params.seqlen_rows == BwdWorkspaceRows::packed_rows(250, 3));
  CHECK(problem.params.seqlen_rows == 640);
  const long long rows = 8LL * 640;  // per head, no batch factor
  CHECK(problem.workspace_rows() == static_cast<std::size_t>(rows));
  CHECK(problem.workspace_bytes() == 2 * (rows * 4) + kCounterSlot + rows * 128 * 4);
  // A sequence's first row: its start plus 128 per sequence before it, rounded down to 128; the
  // previous sequence's padded rows always end before it.
  CHECK(BwdWorkspaceRows::packed_first_row(0, 0) == 0);
  CHECK(BwdWorkspaceRows::packed_first_row(1, 1) == 128);
  CHECK(BwdWorkspaceRows::packed_first_row(2, 129) == 384);
  for (int len0 : {0, 1, 127, 128, 129, 300})
    for (int len1 : {0, 1, 128, 129}) {
      const long long second = BwdWorkspaceRows::packed_first_row(1, len0);
      const long long third = BwdWorkspaceRows::packed_first_row(2, len0 + len1);
      CHECK(second >= BwdWorkspaceRows::padded_rows(len0));
      CHECK(third >= second + BwdWorkspaceRows::padded_rows(len1));
      // A third sequence of one row still fits in the rows sized for the batch.
      CHECK(third + 128 <= BwdWorkspaceRows::packed_rows(len0 + len1 + 1, 3));
    }
  // The varlen variants of every dK/dV family, and of the dQ kernels after them.
  args.options.causal = true;
  const detail::BackwardProblem causal = args.validate();
  const Variant hopper = detail::select_backward_variant(causal, device_of("sm_90a"), args.options);
  CHECK(hopper.name() == "bwd_wgmma_fused.sm90a.bf16.d128.m64n128s2.causal.varlen");
  const Variant ampere = detail::select_backward_variant(causal, device_of("sm_80"), args.options);
  CHECK(ampere.name() == "bwd_mma.sm80.bf16.d128.m64n128s2.causal.varlen");
  args.options.deterministic = true;
  const detail::BackwardProblem exact = args.validate();
  const Variant dkdv = detail::select_backward_variant(exact, device_of("sm_90a"), args.options);
  CHECK(dkdv.name() == "bwd_wgmma.sm90a.bf16.d128.m64n128s2.causal.varlen");
  CHECK(detail::backward_finish_variant(exact, dkdv).name().ends_with(".causal.varlen"));
  CHECK(detail::backward_finish_variant(exact, dkdv).family == "bwd_wgmma_dq");
  const Variant sm80 = detail::select_backward_variant(exact, device_of("sm_80"), args.options);
  CHECK(detail::backward_finish_variant(exact, sm80).family == "bwd_mma_dq");
  CHECK(detail::backward_finish_variant(exact, sm80).varlen);
}

TEST_CASE("varlen backward: bad packed views are refused naming the argument") {
  VarlenBackwardArgs a;
  a.q = a.out = a.dout = a.dq = TensorView::bshd(fake(0x100000), DType::bf16, 2, 125, 8, 128);
  CHECK(a.rejection().find("q.shape[0] is 2: expected 1 for a varlen batch") != std::string::npos);
  VarlenBackwardArgs b;
  b.varlen.cu_seqlens_k = nullptr;
  CHECK(b.rejection().find("varlen.cu_seqlens_k is null") != std::string::npos);
  VarlenBackwardArgs c;
  c.varlen.max_seqlen_q = 251;
  CHECK(c.rejection().find("varlen.max_seqlen_q is 251") != std::string::npos);
  VarlenBackwardArgs d;
  d.lse = nullptr;
  CHECK(d.rejection().find("lse is null: expected the forward's fp32 LSE [heads_q, total_q]") !=
        std::string::npos);
  VarlenBackwardArgs e;
  e.dk = TensorView::bshd(fake(0x800000), DType::bf16, 1, 699, 2, 128);
  CHECK(e.rejection().find("dk.shape[1] (seqlen) is 699: expected 700") != std::string::npos);
  VarlenBackwardArgs f;
  f.varlen.batch = -1;
  CHECK(f.rejection().find("varlen.batch is -1") != std::string::npos);
}

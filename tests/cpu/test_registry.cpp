// The family registry: one list that every surface reads, and one check that precompile and
// forward share.
#include <doctest/doctest.h>

#include <algorithm>
#include <set>

#include "api/dispatch.hpp"
#include "api/validate.hpp"
#include "families/registry.hpp"
#include "flashjit/flashjit.h"
#include "flashjit/flashjit.hpp"

using namespace flashjit;

TEST_CASE("families() lists each registered family once, fastest first, with archs and dims") {
  const auto& list = families();
  REQUIRE(list.size() == detail::registered_families().size());
  CHECK(list.front().name == "decode_tma");  // Hopper's choice for the few query rows it takes
  CHECK(list[1].name == "wgmma");            // then Hopper prefill: dense, varlen, seqused_k
  CHECK(list[2].name == "decode");  // then the rest of decode (sm_80 on, small pages on Hopper)
  std::set<std::string> names;
  std::set<int> dims;
  for (const FamilyInfo& family : list) {
    CAPTURE(family.name);
    CHECK(names.insert(family.name).second);
    CHECK_FALSE(family.summary.empty());
    CHECK_FALSE(family.archs.empty());
    CHECK_FALSE(family.head_dims.empty());
    dims.insert(family.head_dims.begin(), family.head_dims.end());
  }
  CHECK(supported_head_dims() == std::vector<int>(dims.begin(), dims.end()));
  // The C API reads the same list.
  REQUIRE(flashjit_family_count() == static_cast<int32_t>(list.size()));
  for (int32_t i = 0; i < flashjit_family_count(); ++i) {
    const FamilyInfo& family = list[static_cast<std::size_t>(i)];
    CHECK(std::string(flashjit_family_name(i)) == family.name);
    CHECK(flashjit_family_is_attention(i) == (family.attention ? 1 : 0));
    // Not attention: the merge of split-KV partials, the block-mask builder, backward's kernels.
    CHECK(family.attention ==
          (family.name != "merge" && family.name != "blockmask" &&
           family.name != "bwd_blockmask" && !family.backward));
  }
  CHECK(flashjit_family_name(-1) == nullptr);
  CHECK(flashjit_family_name(flashjit_family_count()) == nullptr);
}

TEST_CASE("a head dim the family has no kernel for is refused by name, as forward refuses it") {
  CHECK_THROWS_WITH_AS(Variant::parse("wgmma.sm90a.bf16.d192.m128n64s2"),
                       doctest::Contains("family wgmma has no head_dim 192"), Error);
  CHECK_THROWS_WITH_AS(
      Variant::parse("warp.sm90a.bf16.d128.m128n64s2"),
      doctest::Contains(
          "'warp' is unknown: expected one of decode_tma, wgmma, decode, mma, simt, merge"),
      Error);
}

TEST_CASE("precompile accepts exactly the variants that forward can run (one check)") {
  DeviceInfo h200;
  h200.arch = "sm_90a";
  h200.max_shared_per_block_optin = 227 * 1024;
  void* data = reinterpret_cast<void*>(0x100000);  // validation never dereferences
  int agreed = 0;
  for (const FamilyInfo& family : families()) {
    // Forward runs no backward kernel (test_backward_host checks backward's own choice).
    if (family.backward) continue;
    for (int head_dim : {32, 64, 96, 128, 160, 192, 256})
      for (TileConfig tiles :
           {TileConfig{64, 64, 1}, TileConfig{128, 128, 2}, TileConfig{192, 128, 2},
            TileConfig{128, 176, 2}, TileConfig{128, 48, 3}, TileConfig{96, 64, 2}}) {
        const Variant v{family.name,  "sm_90a",     DType::bf16,  head_dim,
                        tiles.tile_m, tiles.tile_n, tiles.stages, false};
        CAPTURE(v.name());
        bool parses = true;
        try {
          Variant::parse(v.name());
        } catch (const Error&) {
          parses = false;
        }
        bool runs = true;
        Variant chosen;
        try {
          const auto q = TensorView::bshd(data, DType::bf16, 1, 256, 4, head_dim);
          ForwardOptions options;
          options.family = family.name;
          options.tiles = tiles;
          const auto problem = detail::validate_forward(q, q, q, q, options);
          chosen =
              detail::select_variant(problem, h200, detail::forced_family(options.family), tiles);
        } catch (const Error&) {
          runs = false;
        }
        if (runs) CHECK(chosen == v);
        // What this GPU's shared memory cannot hold is refused by forward alone (it depends on
        // the GPU); every other refusal is the same on both sides.
        const bool fits = parses && detail::family_named(family.name, "family").shared_bytes(v) <=
                                        h200.max_shared_per_block_optin;
        CHECK(runs == (parses && fits));
        agreed += parses;
      }
  }
  CHECK(agreed > 10);  // the grid covers accepted variants, not only refusals
}

// The host side of serving (no GPU): decode and merge variants, the split-KV heuristic and plan,
// dispatch of decode-shaped and paged problems, and KVCache validation.
#include <doctest/doctest.h>

#include <cstdint>
#include <string>

#include "api/dispatch.hpp"
#include "api/split_kv.hpp"
#include "api/validate.hpp"
#include "families/decode/split_heuristic.hpp"
#include "families/merge/merge.hpp"
#include "families/registry.hpp"
#include "flashjit/flashjit.hpp"
#include "wgmma/shape.cuh"

using namespace flashjit;

namespace {

void* fake(std::uintptr_t address) { return reinterpret_cast<void*>(address); }
const auto* kTable = reinterpret_cast<const std::int32_t*>(0x900000);
const auto* kLengths = reinterpret_cast<const std::int32_t*>(0xa00000);

DeviceInfo h200() {
  DeviceInfo d;
  d.arch = "sm_90a";
  d.multiprocessors = 132;
  d.max_shared_per_block_optin = 227 * 1024;
  return d;
}

// bf16 d128, 32 query heads over 8 KV heads: the decode table of the serving issue.
detail::ForwardProblem decode_problem(int batch, int seqlen_q, int seqlen_k, bool causal = false,
                                      int num_splits = 0) {
  const auto q = TensorView::bshd(fake(0x100000), DType::bf16, batch, seqlen_q, 32, 128);
  const auto kv = TensorView::bshd(fake(0x200000), DType::bf16, batch, seqlen_k, 8, 128);
  ForwardOptions options;
  options.causal = causal;
  options.num_splits = num_splits;
  return detail::validate_forward(q, KVCache::dense(kv, kv), q, nullptr, options);
}

struct PagedArgs {
  TensorView q = TensorView::bshd(fake(0x100000), DType::bf16, 4, 1, 32, 128);
  TensorView pages = TensorView::bshd(fake(0x200000), DType::bf16, 1000, 16, 8, 128);
  KVCache kv = KVCache::paged(pages, pages, kTable, 64, kLengths);
  ForwardOptions options;
};

std::string rejection(const PagedArgs& a) {
  try {
    detail::validate_forward(a.q, a.kv, a.q, nullptr, a.options);
  } catch (const Error& e) {
    CHECK(e.code() == ErrorCode::invalid_argument);
    return e.what();
  }
  return "(accepted)";
}

const detail::KernelFamily& family(const char* name) {
  return detail::family_named(name, "family");
}

}  // namespace

TEST_CASE("decode and merge variant names parse back; feature suffixes keep their order") {
  for (const char* name :
       {"decode_tma.sm90a.bf16.d128.m16n64s3", "decode.sm90a.bf16.d128.m32n64s3.causal.paged",
        "decode.sm80.fp16.d64.m16n128s2.paged", "merge.sm90a.bf16.d128.m4n1s1"}) {
    CAPTURE(name);
    CHECK(Variant::parse(name).name() == name);
  }
  CHECK(Variant::parse("decode.sm90a.bf16.d128.m16n64s3.paged").paged);
  CHECK_FALSE(Variant::parse("decode.sm90a.bf16.d128.m16n64s3.causal").paged);
  CHECK_THROWS_WITH_AS(Variant::parse("decode.sm90a.bf16.d128.m16n64s3.paged.causal"),
                       doctest::Contains("features field"), Error);
  CHECK_THROWS_WITH_AS(Variant::parse("decode.sm90a.bf16.d128.m16n64s3.paged.paged"),
                       doctest::Contains("features field"), Error);
  // wgmma reads pages in runs that fill power-of-two key tiles; simt reads no pages.
  CHECK(Variant::parse("wgmma.sm90a.bf16.d128.m128n128s2.causal.paged.varlen").paged);
  CHECK_THROWS_WITH_AS(Variant::parse("wgmma.sm90a.bf16.d128.m128n176s2.paged"),
                       doctest::Contains("tile_n 176 must be a power of two of at most 128"),
                       Error);
  CHECK_THROWS_WITH_AS(Variant::parse("wgmma.sm90a.bf16.d64.m128n256s2.paged"),
                       doctest::Contains("tile_n 256 must be a power of two of at most 128"),
                       Error);
  CHECK_THROWS_WITH_AS(Variant::parse("simt.sm90a.bf16.d128.m64n64s1.paged"),
                       doctest::Contains("does not read paged KV caches"), Error);
  // Varlen variants: the wgmma family's own specialization for per-sequence lengths, last.
  const Variant varlen = Variant::parse("wgmma.sm90a.bf16.d128.m128n176s2.causal.varlen");
  CHECK(varlen.varlen);
  CHECK(varlen.causal);
  CHECK(varlen.name() == "wgmma.sm90a.bf16.d128.m128n176s2.causal.varlen");
  CHECK_FALSE(Variant::parse("wgmma.sm90a.bf16.d128.m128n176s2.causal").varlen);
  CHECK_THROWS_WITH_AS(Variant::parse("wgmma.sm90a.bf16.d128.m128n176s2.varlen.causal"),
                       doctest::Contains("features field"), Error);
  CHECK_THROWS_WITH_AS(Variant::parse("decode.sm90a.bf16.d128.m16n64s3.varlen"),
                       doctest::Contains("has no varlen variants"), Error);
  CHECK(Variant::parse("mma.sm80.bf16.d128.m128n64s2.causal.varlen").varlen);
  CHECK_THROWS_WITH_AS(Variant::parse("simt.sm80.bf16.d128.m64n64s1.varlen"),
                       doctest::Contains("has no varlen variants"), Error);
  CHECK_THROWS_WITH_AS(Variant::parse("decode.sm90a.bf16.d256.m32n64s2"),
                       doctest::Contains("use tile_m 16"), Error);
  CHECK_THROWS_WITH_AS(Variant::parse("merge.sm90a.bf16.d128.m4n1s1.causal"),
                       doctest::Contains("no mask"), Error);
  CHECK_THROWS_WITH_AS(Variant::parse("merge.sm90a.bf16.d128.m8n1s1"), doctest::Contains("m4n1s1"),
                       Error);
}

TEST_CASE("precompile's defaults include paged decode, varlen prefill and merge variants") {
  int decode = 0, paged = 0, merge = 0, wgmma = 0, mma = 0, varlen = 0;
  for (const Variant& v : default_variants("sm_90a")) {
    decode += v.family == "decode" || v.family == "decode_tma";
    paged += v.paged;
    merge += v.family == "merge";
    wgmma += v.family == "wgmma";
    mma += v.family == "mma";
    // The forward's varlen variants (the backward's: tests/cpu/test_backward_host.cpp).
    varlen += v.varlen && !v.family.starts_with("bwd_");
    if (v.paged)
      CHECK((v.family.starts_with("decode") || v.family == "wgmma" || v.family == "mma"));
    if (v.varlen) CHECK((v.family == "wgmma" || v.family == "mma" || v.family.starts_with("bwd_")));
    CHECK_NOTHROW(detail::check_variant(v));
  }
  // wgmma and mma: every dense shape once more with per-sequence lengths compiled in (wgmma: 2
  // dtypes x (3 at d64, 4 at d128, 3 at d256); mma: 2 dtypes x 6 head dims x 2 masks, one shape
  // each, twice, and all of it again over pages); wgmma's paged shapes (2 dtypes x (3 at d64, 3
  // at d128, 2 at d256)) both ways too.
  CHECK(wgmma == 40 + 32);
  CHECK(mma == 96);
  CHECK(varlen == 20 + 48 + 16);
  // Each of the two decode kernels: 2 dtypes x 2 masks x 2 caches x (3 + 3 + 1) tiles over
  // d64/d128/d256 (16, 32 and 64 rows; d256 16 only), and decode_tma's tiles for small pages
  // at d128, 16 and 64 rows (2 x 2 dtypes x 2 masks).
  CHECK(decode == 112 + 8);
  CHECK(paged == 64 + 32 + 48);
  CHECK(merge == 12);  // 2 dtypes x 6 head dims
  // d256 decode does not fit the 99 KB of an sm_86 block, so it is not built there.
  for (const Variant& v : default_variants("sm_86")) {
    CHECK(v.family != "decode_tma");
    if (v.family == "decode") CHECK(v.head_dim != 256);
  }
}

TEST_CASE("decode-shaped and paged problems go to the decode family, prefill to wgmma") {
  const DeviceInfo gpu = h200();
  // Up to 16k keys a dense cache takes the 32-row, 64-key tile even for one query row; longer
  // ones 16 rows of 128 keys.
  const Variant one = detail::select_variant(decode_problem(64, 1, 8192), gpu, nullptr);
  CHECK(one.name() == "decode_tma.sm90a.bf16.d128.m32n64s2");
  CHECK(detail::select_variant(decode_problem(8, 1, 32768), gpu, nullptr).name() ==
        "decode_tma.sm90a.bf16.d128.m16n128s2");
  const Variant spec = detail::select_variant(decode_problem(64, 8, 8192, true), gpu, nullptr);
  CHECK(spec.name() == "decode_tma.sm90a.bf16.d128.m32n64s2.causal");
  const Variant prefill = detail::select_variant(decode_problem(8, 512, 8192, true), gpu, nullptr);
  CHECK(prefill.family == "wgmma");
  CHECK_FALSE(prefill.varlen);  // a dense batch runs the kernel without per-sequence lengths
  PagedArgs a;
  const auto paged = detail::validate_forward(a.q, a.kv, a.q, nullptr, a.options);
  // Pages of 16 rows: TMA boxes of one page each into 64-key tiles.
  CHECK(detail::select_variant(paged, gpu, nullptr).name() ==
        "decode_tma.sm90a.bf16.d128.m16n64s2.paged");
  // The pick over a cache of num_pages pages of page_size rows (8 per sequence).
  auto pick_for_pages = [&](std::int64_t num_pages, std::int64_t page_size,
                            const std::int32_t* seqused) {
    PagedArgs p;
    p.pages = TensorView::bshd(fake(0x200000), DType::bf16, num_pages, page_size, 8, 128);
    p.kv = KVCache::paged(p.pages, p.pages, kTable, 8, seqused);
    return detail::select_variant(detail::validate_forward(p.q, p.kv, p.q, nullptr, p.options),
                                  gpu, nullptr)
        .name();
  };
  // Pages of 8 rows (and small pages at other head dims): the cp.async kernel gathers them.
  CHECK(pick_for_pages(2000, 8, kLengths) == "decode.sm90a.bf16.d128.m16n64s3.paged");
  // A stage more than dense over pages of 128 rows.
  CHECK(pick_for_pages(100, 128, nullptr) == "decode_tma.sm90a.bf16.d128.m16n128s3.paged");
  // Elsewhere the cp.async kernel of the same family takes it.
  DeviceInfo a100 = gpu;
  a100.arch = "sm_80";
  a100.max_shared_per_block_optin = 163 * 1024;
  CHECK(detail::select_variant(paged, a100, nullptr).name() ==
        "decode.sm80.bf16.d128.m16n64s2.paged");
  // Forcing a family without the feature names what is missing.
  CHECK_THROWS_WITH_AS(detail::select_variant(paged, gpu, &family("simt")),
                       doctest::Contains("reads no paged KV cache"), Error);
  CHECK_THROWS_WITH_AS(detail::forced_family(std::string("merge")),
                       doctest::Contains("expected an attention family"), Error);
}

TEST_CASE("paged prefill runs in wgmma on Hopper, in TMA runs from pages of 64, else gathered") {
  const DeviceInfo gpu = h200();
  // 300 queries x 4 query heads per KV head (more than decode's 64 rows) over pages of
  // page_size rows (HND pages where hnd), with seqused_k where seqused.
  struct Pick {
    int head_dim = 128, page_size = 16, num_splits = 0, seqlen_q = 300;
    bool causal = true, seqused = true, hnd = false;
    const DeviceInfo* device = nullptr;
  };
  auto pick = [&](const Pick& c) {
    const auto q = TensorView::bshd(fake(0x100000), DType::bf16, 4, c.seqlen_q, 32, c.head_dim);
    const TensorView pages =
        c.hnd ? TensorView::bhsd(fake(0x200000), DType::bf16, 4096 / c.page_size * 4, c.page_size,
                                 8, c.head_dim)
              : TensorView::bshd(fake(0x200000), DType::bf16, 4096 / c.page_size * 4, c.page_size,
                                 8, c.head_dim);
    ForwardOptions options;
    options.causal = c.causal;
    options.num_splits = c.num_splits;
    const KVCache kv =
        KVCache::paged(pages, pages, kTable, 4096 / c.page_size, c.seqused ? kLengths : nullptr);
    return detail::select_variant(detail::validate_forward(q, kv, q, nullptr, options),
                                  c.device ? *c.device : gpu, nullptr)
        .name();
  };
  // Runs of 64 rows or more (the page size's power-of-two part) go by TMA, the rest are gathered
  // row by row (WgmmaSchedule::gather_pages), which wgmma_plan sets from this rule.
  for (int page_size : {8, 16, 24, 32, 48, 72, 96}) CHECK(wgmma_gathers_pages(page_size));
  for (int page_size : {64, 128, 192, 256, 512}) CHECK_FALSE(wgmma_gathers_pages(page_size));
  CHECK(pick({}) == "wgmma.sm90a.bf16.d128.m128n128s2.causal.paged.varlen");
  CHECK(pick({.seqused = false}) == "wgmma.sm90a.bf16.d128.m128n128s2.causal.paged");
  CHECK(pick({.page_size = 256, .causal = false, .seqused = false, .hnd = true}) ==
        "wgmma.sm90a.bf16.d128.m128n128s2.paged");  // 4096 keys: past 1k, two stages
  CHECK(pick({.head_dim = 64, .page_size = 48}) ==
        "wgmma.sm90a.bf16.d64.m128n128s3.causal.paged.varlen");
  CHECK(pick({.head_dim = 256, .page_size = 64}) ==
        "wgmma.sm90a.bf16.d256.m128n64s2.causal.paged.varlen");
  // Pages of 8 rows too; forced splits: decode_tma splits.
  CHECK(pick({.page_size = 8}) == "wgmma.sm90a.bf16.d128.m128n128s2.causal.paged.varlen");
  CHECK(pick({.num_splits = 2}).starts_with("decode_tma.sm90a.bf16.d128."));
  // Decode-sized rows stay with the decode kernels, pages decode_tma does not read too.
  CHECK(pick({.seqlen_q = 16}).starts_with("decode_tma.sm90a.bf16.d128."));
  CHECK(pick({.head_dim = 256, .page_size = 16, .seqlen_q = 4}).starts_with("decode.sm90a."));
  // Forcing decode_tma on paged prefill names why it leaves it to wgmma.
  const auto q = TensorView::bshd(fake(0x100000), DType::bf16, 4, 300, 32, 128);
  const auto pages = TensorView::bshd(fake(0x200000), DType::bf16, 1024, 16, 8, 128);
  const auto problem = detail::validate_forward(
      q, KVCache::paged(pages, pages, kTable, 256, kLengths), q, nullptr, ForwardOptions{});
  CHECK_THROWS_WITH_AS(detail::select_variant(problem, gpu, &family("decode_tma")),
                       doctest::Contains("unless paged in pages wgmma does not read"), Error);
  // Forcing wgmma on a decode step over pages names why it leaves those to decode.
  const auto q_step = TensorView::bshd(fake(0x100000), DType::bf16, 4, 2, 32, 128);
  const auto step = detail::validate_forward(
      q_step, KVCache::paged(pages, pages, kTable, 256, kLengths), q_step, nullptr, {});
  CHECK_THROWS_WITH_AS(detail::select_variant(step, gpu, &family("wgmma")),
                       doctest::Contains("leaves paged problems of at most 64"), Error);
  // Off Hopper mma's 128-row tiles take it (the decode kernels only when split).
  DeviceInfo a100 = gpu;
  a100.arch = "sm_80";
  a100.max_shared_per_block_optin = 163 * 1024;
  CHECK(pick({.device = &a100}) == "mma.sm80.bf16.d128.m128n48s1.causal.paged.varlen");
  CHECK(pick({.num_splits = 2, .device = &a100}).starts_with("decode.sm80.bf16.d128."));
  CHECK_THROWS_WITH_AS(detail::select_variant(problem, a100, &family("decode")),
                       doctest::Contains("unless paged, varlen or with seqused_k, and split"), Error);
  // Head dims only mma has: it gathers the pages (on every arch; before, no family took them).
  CHECK(pick({.head_dim = 96}) == "mma.sm90a.bf16.d96.m128n64s2.causal.paged.varlen");
  CHECK(pick({.head_dim = 192, .page_size = 24, .seqlen_q = 2, .device = &a100}) ==
        "mma.sm80.bf16.d192.m64n64s1.causal.paged.varlen");
}

TEST_CASE("64-row decode tiles: two row groups of 4 warps share each K/V tile") {
  const DeviceInfo gpu = h200();
  // Speculative decode with GQA: 16 queries x 4 query heads per KV head = 64 rows.
  const auto problem = decode_problem(64, 16, 8192, true);
  CHECK(detail::select_variant(problem, gpu, nullptr).name() ==
        "decode_tma.sm90a.bf16.d128.m64n64s3.causal");  // the table's
  const Variant v = detail::select_variant(problem, gpu, nullptr, TileConfig{64, 64, 4});
  CHECK(v.name() == "decode_tma.sm90a.bf16.d128.m64n64s4.causal");
  const DecodeShape shape = detail::decode_shape(v);
  CHECK(shape.row_groups() == 2);
  CHECK(shape.group_rows() == 32);
  CHECK(shape.threads() == 256);
  // The key warps' states are merged one row group at a time: no more room than 32 rows take.
  CHECK(shape.merge_bytes() == DecodeShape{128, 32, 64, 4, true}.merge_bytes());
  CHECK(detail::decode_ctas_per_sm(shape, gpu) == 1);
  // The launch (the cp.async kernel's: its plan encodes no tensor map): 256 threads, one row
  // block per (split, KV head, sequence).
  const Variant cp_async =
      detail::select_variant(problem, gpu, &family("decode"), TileConfig{64, 64, 3});
  const detail::LaunchPlan plan = family("decode").plan(cp_async, problem, gpu);
  CHECK(plan.block[0] == 256);
  CHECK(plan.grid[0] == static_cast<unsigned>(detail::decode_num_splits(cp_async, problem, gpu)));
  CHECK(plan.grid[1] == 8);
  CHECK(plan.grid[2] == 64);
  // Up to 32 rows a tile is one row group of 128 threads, as before.
  CHECK(DecodeShape{128, 32, 64, 2, true}.threads() == 128);
  CHECK(DecodeShape{128, 16, 128, 2, true}.row_groups() == 1);
  // d256 would need more than 255 registers a thread; other row counts are no tile.
  CHECK_THROWS_WITH_AS(detail::check_variant(Variant::parse("decode.sm80.bf16.d256.m64n64s2")),
                       doctest::Contains("tile_m 64 with head_dim 256"), Error);
  CHECK_THROWS_WITH_AS(detail::select_variant(problem, gpu, nullptr, TileConfig{48, 64, 2}),
                       doctest::Contains("tile_m 48 must be 16, 32 or 64"), Error);
}

TEST_CASE("the split heuristic fills the GPU: few splits for big batches, many for one sequence") {
  const DeviceInfo gpu = h200();
  auto splits = [&](int batch, int seqlen_q, int seqlen_k) {
    const auto problem = decode_problem(batch, seqlen_q, seqlen_k);
    const Variant v = detail::select_variant(problem, gpu, nullptr);
    // Up to 16k keys 32 rows of 64 keys in two stages (80 KB), two CTAs per SM; past that 16 rows
    // of 128 keys (133 KB), one CTA per SM.
    CHECK(detail::decode_ctas_per_sm(detail::decode_shape(v), gpu) ==
          (seqlen_k <= 16384 ? 2 : 1));
    return detail::decode_num_splits(v, problem, gpu);
  };
  // 2 CTAs of ~106 KB (32 rows, 64 keys, 3 stages) fit an SM.
  CHECK(DecodeShape{128, 32, 64, 3, true}.shared_bytes() / 1024 == 105);
  CHECK(detail::decode_ctas_per_sm(DecodeShape{128, 32, 64, 3, true}, gpu) == 2);
  CHECK(splits(64, 1, 8192) == 1);    // 512 CTAs on 2 x 132 slots: two nearly full waves
  CHECK(splits(8, 1, 32768) == 2);    // 64 x 2 = 128 CTAs: one wave
  CHECK(splits(1, 1, 131072) == 16);  // 8 x 16 = 128 CTAs
  CHECK(splits(1, 1, 64) == 1);       // one key tile cannot be split
  // The caller's count wins; the plan sizes the workspace for it.
  const auto forced = decode_problem(2, 3, 1000, false, 5);
  const Variant v = detail::select_variant(forced, gpu, nullptr);
  const detail::SplitPlan plan = detail::plan_splits(family("decode"), v, forced, gpu);
  CHECK(plan.num_splits == 5);
  CHECK(v.family == "decode_tma");
  CHECK(plan.split_tiles == 4);  // 16 tiles of 64 keys over 5 splits
  const std::size_t rows = 2 * 3 * 32 * 5;
  CHECK(plan.lse_offset == (rows * 128 * 4 + 255) / 256 * 256);
  CHECK(plan.workspace_bytes == plan.lse_offset + (rows * 4 + 255) / 256 * 256);
  // A family without split-KV: one split, no workspace.
  const auto prefill = decode_problem(1, 1000, 1000);
  const Variant w = detail::select_variant(prefill, gpu, nullptr);
  CHECK(detail::plan_splits(family(w.family.c_str()), w, prefill, gpu).workspace_bytes == 0);
}

TEST_CASE("a paged KV cache is validated before any launch, naming the argument") {
  PagedArgs ok;
  const auto problem = detail::validate_forward(ok.q, ok.kv, ok.q, nullptr, ok.options);
  CHECK(problem.paged);
  CHECK(problem.seqlen_k == 64 * 16);
  CHECK(problem.params.page_size == 16);
  CHECK(problem.params.page_table_stride == 64);

  PagedArgs odd_page;
  odd_page.pages = TensorView::bshd(fake(0x200000), DType::bf16, 1000, 12, 8, 128);
  odd_page.kv = KVCache::paged(odd_page.pages, odd_page.pages, kTable, 64);
  CHECK(rejection(odd_page).find("page_size) is 12: expected a positive multiple of 8") !=
        std::string::npos);

  PagedArgs no_table;
  no_table.kv.page_table = nullptr;
  CHECK(rejection(no_table).find("kv.page_table is null") != std::string::npos);

  PagedArgs columns;
  columns.kv.pages_per_seq = 0;
  CHECK(rejection(columns).find("kv.pages_per_seq is 0") != std::string::npos);

  PagedArgs stride;
  stride.kv.page_table_stride = 10;
  CHECK(rejection(stride).find("kv.page_table_stride is 10") != std::string::npos);

  PagedArgs shapes;
  shapes.kv.v = TensorView::bshd(fake(0x300000), DType::bf16, 1000, 32, 8, 128);
  CHECK(rejection(shapes).find("kv.v.shape[1]") != std::string::npos);

  PagedArgs lengths;
  lengths.kv.seqused_k = reinterpret_cast<const std::int32_t*>(0xa00002);
  CHECK(rejection(lengths).find("kv.seqused_k") != std::string::npos);

  for (int splits : {-1, 129}) {
    PagedArgs a;
    a.options.num_splits = splits;
    CHECK(rejection(a).find("options.num_splits is") != std::string::npos);
  }
  PagedArgs workspace;
  workspace.options.workspace = fake(0x100010);
  CHECK(rejection(workspace).find("options.workspace") != std::string::npos);

  // Query rows per KV head past the decode grid's limit: the decode kernels say why before
  // anything is planned (seqlen_q x heads_q / heads_kv was an int product, and overflowed:
  // fuzz_serving_args found it); mma, which gathers pages a row at a time, takes it.
  PagedArgs rows;
  rows.q = TensorView{fake(0x100000), DType::bf16, {1, 738197804, 32, 128}, {8, 8, 8, 1}};
  const auto out = TensorView::bshd(fake(0x300000), DType::bf16, 1, 738197804, 32, 128);
  const auto many = detail::validate_forward(rows.q, rows.kv, out, nullptr, rows.options);
  CHECK(many.rows_per_kv_head() == 738197804LL * 4);
  CHECK(detail::select_variant(many, h200(), nullptr).family == "mma");
  try {
    detail::select_variant(many, h200(), &family("decode"));
    FAIL("dispatched a problem past the decode grid's rows");
  } catch (const Error& e) {
    CHECK(e.code() == ErrorCode::unsupported);
    CHECK(std::string(e.what()).find("query rows per KV head (seqlen_q x heads_q / heads_kv; its "
                                     "grid's limit), this problem has 2952791216") !=
          std::string::npos);
  }

  // Lengths past 2^30 (room for the tile arithmetic in int32), dense or paged.
  PagedArgs long_q;
  long_q.q = TensorView::bshd(fake(0x100000), DType::bf16, 1, (1LL << 30) + 1, 32, 128);
  CHECK(rejection(long_q).find("q.shape[1] (seqlen_q) is 1073741825: expected at most 2^30") !=
        std::string::npos);
  PagedArgs capacity;
  capacity.kv.pages_per_seq = capacity.kv.page_table_stride = (1LL << 26) + 1;
  capacity.q.shape[0] = 1;
  CHECK(rejection(capacity).find("kv.pages_per_seq (67108865) x page_size (16) keys: expected at "
                                 "most 2^30") != std::string::npos);
  PagedArgs empty_batch;  // no rows to bound the page table's stride: the product is checked
  empty_batch.q.shape[0] = 0;
  empty_batch.kv.pages_per_seq = empty_batch.kv.page_table_stride = std::int64_t{1} << 62;
  CHECK(rejection(empty_batch).find("x page_size (16) keys: expected at most 2^30") !=
        std::string::npos);

  PagedArgs hnd;  // the HND layout is the same pages through other strides
  hnd.pages = TensorView::bhsd(fake(0x200000), DType::bf16, 1000, 16, 8, 128);
  hnd.kv = KVCache::paged(hnd.pages, hnd.pages, kTable, 64);
  CHECK(detail::validate_forward(hnd.q, hnd.kv, hnd.q, nullptr, hnd.options).params.k_stride_s ==
        128);
}

TEST_CASE("merge_attention_states arguments: equal shapes and strides, LSE buffers") {
  const auto a = TensorView::bshd(fake(0x100000), DType::bf16, 2, 10, 4, 128);
  const auto b = TensorView::bshd(fake(0x200000), DType::bf16, 2, 10, 4, 128);
  auto* lse_a = reinterpret_cast<const float*>(0x300000);
  auto* lse_b = reinterpret_cast<const float*>(0x300400);
  const MergeParams m = detail::validate_merge(a, lse_a, b, lse_b, a, nullptr);
  CHECK(m.o_stride_state == (0x200000 - 0x100000) / 2);
  CHECK(m.lse_stride_state == 0x400 / 4);
  CHECK(m.num_states == 2);
  CHECK_THROWS_WITH_AS(detail::validate_merge(a, nullptr, b, lse_b, a, nullptr),
                       doctest::Contains("lse_a is null"), Error);
  const auto other = TensorView::bhsd(fake(0x200000), DType::bf16, 2, 10, 4, 128);
  CHECK_THROWS_WITH_AS(detail::validate_merge(a, lse_a, other, lse_b, a, nullptr),
                       doctest::Contains("out_b.stride[1]"), Error);
  // Batch 1: stride[0] addresses nothing, so b's may differ (a slice of a longer sequence).
  const auto one_a = TensorView::bshd(fake(0x100000), DType::bf16, 1, 10, 4, 128);
  auto one_b = TensorView::bshd(fake(0x200000), DType::bf16, 1, 10, 4, 128);
  one_b.stride[0] *= 2;
  CHECK(detail::validate_merge(one_a, lse_a, one_b, lse_b, one_a, nullptr).o_stride_b ==
        one_a.stride[0]);
  CHECK(detail::merge_plan(10).grid[0] == 3);  // 4 rows per CTA
  CHECK(detail::merge_variant("sm_90a", DType::fp16, 64).name() == "merge.sm90a.fp16.d64.m4n1s1");
}

TEST_CASE("a varlen batch is validated against its packed views; prefill goes to wgmma on Hopper") {
  const auto* cu_q = reinterpret_cast<const std::int32_t*>(0xb00000);
  const auto* cu_k = reinterpret_cast<const std::int32_t*>(0xc00000);
  const auto q = TensorView::bshd(fake(0x100000), DType::bf16, 1, 1000, 32, 128);
  const auto kv = TensorView::bshd(fake(0x200000), DType::bf16, 1, 5000, 8, 128);
  const KVCache dense = KVCache::dense(kv, kv);
  const VarlenBatch good{cu_q, cu_k, 7, 300, 2000};
  auto rejection = [&](const TensorView& query, const KVCache& cache, const VarlenBatch& varlen) {
    try {
      detail::validate_forward(query, cache, query, &varlen, ForwardOptions{});
    } catch (const Error& e) {
      CHECK(e.code() == ErrorCode::invalid_argument);
      return std::string(e.what());
    }
    return std::string("(accepted)");
  };
  const auto problem = detail::validate_forward(q, dense, q, &good, ForwardOptions{});
  CHECK(problem.varlen);
  CHECK(problem.batch == 7);
  CHECK(problem.seqlen_q == 300);
  CHECK(problem.seqlen_k == 2000);
  CHECK(problem.params.total_q == 1000);
  CHECK(problem.params.cu_seqlens_k == cu_k);
  // Prefill-sized rows (300 x 4 per KV head): Hopper's prefill kernel, which decode_tma leaves to
  // it; mma's varlen variants on sm_80, which decode leaves to them; forced splits: decode.
  const Variant prefill = detail::select_variant(problem, h200(), nullptr);
  CHECK(prefill.family == "wgmma");
  CHECK(prefill.varlen);
  CHECK_THROWS_WITH_AS(detail::select_variant(problem, h200(), &family("decode_tma")),
                       doctest::Contains("unless paged"), Error);
  DeviceInfo a100 = h200();
  a100.arch = "sm_80";
  a100.multiprocessors = 108;
  a100.max_shared_per_block_optin = 163 * 1024;
  CHECK(detail::select_variant(problem, a100, nullptr).family == "mma");
  CHECK_THROWS_WITH_AS(detail::select_variant(problem, a100, &family("decode")),
                       doctest::Contains("unless paged, varlen or with seqused_k, and split"), Error);
  ForwardOptions split_on_a100;
  split_on_a100.num_splits = 2;
  CHECK(detail::select_variant(detail::validate_forward(q, dense, q, &good, split_on_a100), a100,
                               nullptr)
            .family == "decode");
  const Variant forced_mma = detail::select_variant(problem, a100, &family("mma"));
  CHECK(forced_mma.family == "mma");
  CHECK(forced_mma.varlen);
  CHECK_THROWS_WITH_AS(detail::select_variant(problem, a100, &family("simt")),
                       doctest::Contains("takes no varlen batch"), Error);
  ForwardOptions split;
  split.num_splits = 4;
  CHECK(detail::select_variant(detail::validate_forward(q, dense, q, &good, split), h200(), nullptr)
            .family == "decode");
  // Head dims without decode or wgmma kernels: mma's varlen variants, prefill- or decode-sized,
  // on Hopper and sm_80 alike.
  const auto q96 = TensorView::bshd(fake(0x100000), DType::bf16, 1, 1000, 32, 96);
  const auto kv96 = TensorView::bshd(fake(0x200000), DType::bf16, 1, 5000, 8, 96);
  VarlenBatch decode_sized96 = good;
  decode_sized96.max_seqlen_q = 16;
  for (const VarlenBatch& batch : {good, decode_sized96})
    for (const DeviceInfo& gpu : {h200(), a100}) {
      const Variant v = detail::select_variant(
          detail::validate_forward(q96, KVCache::dense(kv96, kv96), q96, &batch, {}), gpu, nullptr);
      CHECK(v.family == "mma");
      CHECK(v.varlen);
    }
  // Decode-sized rows (16 x 4 per KV head) stay with decode_tma.
  VarlenBatch decode_sized = good;
  decode_sized.max_seqlen_q = 16;
  CHECK(detail::select_variant(detail::validate_forward(q, dense, q, &decode_sized, {}), h200(),
                               nullptr)
            .family == "decode_tma");

  VarlenBatch no_q = good;
  no_q.cu_seqlens_q = nullptr;
  CHECK(rejection(q, dense, no_q).find("varlen.cu_seqlens_q is null") != std::string::npos);
  VarlenBatch no_k = good;
  no_k.cu_seqlens_k = nullptr;
  CHECK(rejection(q, dense, no_k).find("varlen.cu_seqlens_k is null") != std::string::npos);
  VarlenBatch long_q = good;
  long_q.max_seqlen_q = 1001;
  CHECK(rejection(q, dense, long_q).find("varlen.max_seqlen_q is 1001") != std::string::npos);
  VarlenBatch zero_q = good;
  zero_q.max_seqlen_q = 0;
  CHECK(rejection(q, dense, zero_q).find("varlen.max_seqlen_q is 0") != std::string::npos);
  VarlenBatch negative = good;
  negative.batch = -1;
  CHECK(rejection(q, dense, negative).find("varlen.batch is -1") != std::string::npos);
  const auto batched = TensorView::bshd(fake(0x100000), DType::bf16, 2, 500, 32, 128);
  CHECK(rejection(batched, dense, good).find("q.shape[0] is 2: expected 1") != std::string::npos);
  const auto pages = TensorView::bshd(fake(0x200000), DType::bf16, 100, 64, 8, 128);
  const KVCache paged = KVCache::paged(pages, pages, kTable, 10);
  CHECK(rejection(q, paged, good).find("cu_seqlens_k is set for a paged cache") !=
        std::string::npos);
  VarlenBatch paged_ok = good;
  paged_ok.cu_seqlens_k = nullptr;
  CHECK(detail::validate_forward(q, paged, q, &paged_ok, ForwardOptions{}).seqlen_k == 640);
  // No sequences: a no-op.
  const VarlenBatch none{cu_q, cu_k, 0, 0, 0};
  CHECK(detail::validate_forward(q, dense, q, &none, ForwardOptions{}).empty());
}

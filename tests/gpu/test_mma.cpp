// The mma family beyond the shared suite: K/V rings that wrap many times with a ragged last tile,
// every head dim in both dtypes, and a 131072-token sequence (no buffer grows with seqlen²).
#include <doctest/doctest.h>
#include <fmt/format.h>

#include <cmath>
#include <cstdint>
#include <vector>

#include "flashjit/device_memory.hpp"
#include "forward_case.hpp"
#include "gpu.hpp"
#include "reference.hpp"

using namespace flashjit;
using namespace flashjit::test;

TEST_CASE("mma: many K/V tiles with a ragged last tile, every head dim, both dtypes") {
  unsigned seed = 77;
  for (DType dtype : {DType::bf16, DType::fp16})
    for (int d : supported_head_dims())
      for (bool causal : {false, true}) {
        // 1029 keys: at least 4 tiles for any tile_n <= 256, the last one partial; 333 queries
        // against 1029 keys puts the causal diagonal off the tile grid.
        const ForwardCase c{1, 2, 1, 333, 1029, d, causal, dtype, /*bhsd=*/d % 64 != 0};
        const ForwardCheck check = run_forward_case(shared_engine(), c, "mma", seed++);
        INFO(check.variant, " on ", c.describe());
        INFO("max abs ", check.max_abs_error, ", rel l2 ", check.relative_l2_error, ", lse ",
             check.max_lse_error);
        check_within_bounds(check, dtype);
      }
}

namespace {

// Cheap deterministic bf16 values in [-1, 1): the long case fills 800 M of them.
void fill_bf16(std::vector<std::uint16_t>& bits, std::uint64_t seed) {
  std::uint64_t state = seed * 0x9e3779b97f4a7c15ull + 1;
  for (auto& b : bits) {
    state = state * 6364136223846793005ull + 1442695040888963407ull;
    const float value = static_cast<float>(static_cast<std::int32_t>(state >> 32)) * 0x1p-31f;
    b = from_float(DType::bf16, value);
  }
}

}  // namespace

TEST_CASE("mma: batch 1, 16 heads, seqlen 131072, d128, causal, in O(seqlen) memory") {
  constexpr std::int64_t kSeq = 131072, kHeads = 16, kDim = 128;
  const std::size_t count = static_cast<std::size_t>(kSeq * kHeads * kDim);
  std::vector<std::uint16_t> q(count), k(count), v(count), out(count);
  fill_bf16(q, 1);
  fill_bf16(k, 2);
  fill_bf16(v, 3);

  Engine& engine = shared_engine();
  DeviceBuffer dq(engine, count * 2), dk(engine, count * 2), dv(engine, count * 2),
      dout(engine, count * 2), dlse(engine, static_cast<std::size_t>(kHeads * kSeq) * 4);
  dq.upload(q.data(), count * 2);
  dk.upload(k.data(), count * 2);
  dv.upload(v.data(), count * 2);
  dout.fill_bytes(0xff);  // NaN: anything left unwritten shows
  auto view = [&](const DeviceBuffer& b) {
    return TensorView::bshd(b.data(), DType::bf16, 1, kSeq, kHeads, kDim);
  };
  ForwardOptions options;
  options.causal = true;
  options.family = "mma";
  options.lse = static_cast<float*>(dlse.data());
  engine.forward(view(dq), view(dk), view(dv), view(dout), options);
  synchronize(engine);
  dout.download(out.data(), count * 2);
  std::vector<float> lse(static_cast<std::size_t>(kHeads * kSeq));
  dlse.download(lse.data(), lse.size() * 4);

  std::size_t non_finite = 0;
  for (std::uint16_t b : out) non_finite += !std::isfinite(to_float(DType::bf16, b));
  CHECK(non_finite == 0);

  // Spot rows against float64, row by row (a full reference would be 2^34 scores per head).
  const double scale = 1.0 / std::sqrt(static_cast<double>(kDim));
  auto at = [&](const std::vector<std::uint16_t>& t, std::int64_t s, std::int64_t h, int d) {
    const auto index = static_cast<std::size_t>((s * kHeads + h) * kDim + d);
    return static_cast<double>(to_float(DType::bf16, t[index]));
  };
  double max_error = 0, max_lse_error = 0;
  for (std::int64_t h : {std::int64_t{0}, kHeads - 1})
    for (std::int64_t row : {std::int64_t{0}, std::int64_t{1}, std::int64_t{4097},
                             std::int64_t{65536}, kSeq - 1}) {
      std::vector<double> scores(static_cast<std::size_t>(row + 1));
      double max_score = -INFINITY;
      for (std::int64_t key = 0; key <= row; ++key) {
        double dot = 0;
        for (int d = 0; d < kDim; ++d) dot += at(q, row, h, d) * at(k, key, h, d);
        scores[static_cast<std::size_t>(key)] = dot * scale;
        max_score = std::max(max_score, dot * scale);
      }
      double sum = 0;
      for (double& s : scores) sum += (s = std::exp(s - max_score));
      for (int d = 0; d < kDim; ++d) {
        double want = 0;
        for (std::int64_t key = 0; key <= row; ++key)
          want += scores[static_cast<std::size_t>(key)] * at(v, key, h, d);
        max_error = std::max(max_error, std::abs(want / sum - at(out, row, h, d)));
      }
      const double want_lse = max_score + std::log(sum);
      max_lse_error = std::max(
          max_lse_error, std::abs(want_lse - lse[static_cast<std::size_t>(h * kSeq + row)]));
    }
  INFO("max abs error ", max_error, ", max lse error ", max_lse_error);
  CHECK(max_error <= max_abs_tolerance(DType::bf16));
  CHECK(max_lse_error <= 1e-2);
  MESSAGE(fmt::format("seqlen 131072 causal d128: max abs {:.2e}, lse {:.2e}", max_error,
                      max_lse_error));
}

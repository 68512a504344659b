#include "serving_checks.hpp"

#include <doctest/doctest.h>
#include <fmt/format.h>
#include <fmt/ranges.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>

#include "compare.hpp"
#include "gpu.hpp"
#include "numerics_case.hpp"  // row_is_zero

namespace flashjit::test {

bool decode_has_head_dim(int head_dim) {
  return head_dim < 256 || shared_engine().device().max_shared_per_block_optin >= 160 * 1024;
}

std::string paged_prefill_family(int head_dim, int page_size, long long rows_per_kv_head,
                                 int num_splits) {
  if (rows_per_kv_head <= 64 || num_splits > 1 || page_size % 8 != 0 ||
      !(head_dim == 64 || head_dim == 128 || head_dim == 256))
    return "";
  return shared_engine().device().arch == "sm_90a" ? "wgmma" : "mma";
}

std::vector<std::optional<std::string>> decode_kernels() {
  std::vector<std::optional<std::string>> kernels = {std::nullopt};
  if (shared_engine().device().arch == "sm_90a") kernels.push_back("decode");
  return kernels;
}

bool all_poison(const HostTensor& out) {
  return std::all_of(out.bits.begin(), out.bits.end(), [](std::uint16_t x) { return x == 0xffff; });
}

bool all_poison(const std::vector<float>& lse) {
  return std::all_of(lse.begin(), lse.end(), [](float x) {
    std::uint32_t bits;
    std::memcpy(&bits, &x, 4);
    return bits == 0xffffffffu;
  });
}

int check_against(const HostTensor& out, const std::vector<float>& lse, const Reference& ref,
                  DType dtype) {
  check_within_bounds(compare_forward(out, &lse, ref), dtype);
  const auto& shape = out.view.shape;  // [b, sq, hq, d]
  int empty = 0, nonzero = 0;
  for (std::int64_t b = 0; b < shape[0]; ++b)
    for (std::int64_t h = 0; h < shape[2]; ++h)
      for (std::int64_t i = 0; i < shape[1]; ++i)
        if (std::isinf(ref.lse[static_cast<std::size_t>((b * shape[2] + h) * shape[1] + i)])) {
          ++empty;
          nonzero += !row_is_zero(out, b, i, h);
        }
  CHECK_MESSAGE(nonzero == 0, nonzero, " of ", empty, " rows that see no key are not 0");
  return empty;
}

std::vector<int> check_varlen_against(const HostVarlen& host, const std::vector<Reference>& refs,
                                      const HostTensor& out, const std::vector<float>& lse) {
  const VarlenCase& c = host.shape;
  std::vector<int> empty(static_cast<std::size_t>(c.batch()), 0);
  for (int b = 0; b < c.batch(); ++b) {
    const auto s = static_cast<std::size_t>(b);
    if (c.seqlens_q[s] == 0) continue;  // nothing of its own; the poison check below covers it
    const std::string sequence = fmt::format("sequence {}: {} queries at row {}, {} keys", b,
                                             c.seqlens_q[s], host.cu_seqlens_q[s], c.length(b));
    CAPTURE(sequence);
    empty[s] =
        check_against(host.sequence_rows(out, b), host.sequence_lse(lse, b), refs[s], c.dtype);
  }
  const std::vector<bool> owned_out = host.written_out();
  std::size_t stray_out = 0;
  for (std::size_t i = 0; i < owned_out.size(); ++i)
    stray_out += !owned_out[i] && out.bits[i] != 0xffff;
  CHECK_MESSAGE(stray_out == 0, stray_out,
                " output elements no sequence owns (stride gaps, tail rows) were written");
  const std::vector<bool> owned_lse = host.written_lse();
  std::size_t stray_lse = 0;
  for (std::size_t i = 0; i < owned_lse.size(); ++i) {
    std::uint32_t bits;
    std::memcpy(&bits, &lse[i], 4);
    stray_lse += !owned_lse[i] && bits != 0xffffffffu;
  }
  CHECK_MESSAGE(stray_lse == 0, stray_lse, " LSE entries of tail rows were written");
  return empty;
}

namespace {

// `call` throws Error(code); with `names`, its message names one of them.
void check_throws(const std::string& what, const std::function<void()>& call, ErrorCode code,
                  const std::vector<std::string>& names) {
  CAPTURE(what);
  try {
    call();
    FAIL_CHECK(what, ": accepted");
  } catch (const Error& e) {
    const std::string message = e.what();
    CAPTURE(message);
    CHECK(e.code() == code);
    if (names.empty()) return;
    const bool named = std::any_of(names.begin(), names.end(), [&](const std::string& name) {
      return message.find(name) != std::string::npos;
    });
    CHECK_MESSAGE(named, "the message names none of ", fmt::format("{}", fmt::join(names, ", ")));
  }
}

}  // namespace

void check_refused(const std::string& what, const std::function<void()>& call,
                   const std::vector<std::string>& names) {
  check_throws(what, call, ErrorCode::invalid_argument, names);
}

void check_unsupported(const std::string& what, const std::function<void()>& call) {
  check_throws(what, call, ErrorCode::unsupported, {});
}

}  // namespace flashjit::test

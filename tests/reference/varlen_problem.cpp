#include "varlen_problem.hpp"

#include "kv_storage.hpp"

#include <fmt/format.h>
#include <fmt/ranges.h>

#include <algorithm>
#include <cmath>
#include <numeric>
#include <stdexcept>

namespace flashjit::test {
namespace {

std::size_t lse_count(const VarlenCase& c) {
  return static_cast<std::size_t>(c.heads_q) * static_cast<std::size_t>(c.total_q());
}

std::size_t at(int i) { return static_cast<std::size_t>(i); }

void check_case(const VarlenCase& c) {
  auto fail = [&](const std::string& what) {
    throw std::invalid_argument(fmt::format("VarlenCase {}: {}", c.describe(), what));
  };
  if (c.heads_q < 1 || c.heads_kv < 1 || c.head_dim < 1) fail("sizes must be positive");
  if (c.heads_q % c.heads_kv != 0) fail("heads_q must be a multiple of heads_kv");
  if (c.batch() < 1) fail("needs at least one sequence");
  for (int length : c.seqlens_q)
    if (length < 0) fail("query lengths must be >= 0");
  if (c.total_q() < 1) fail("needs at least one query row (buffers of 0 bytes)");
  if (c.head_padding < 0 || c.row_padding < 0 || c.tail_rows < 0 || c.head_padding % 8 != 0 ||
      c.row_padding % 8 != 0)
    fail("paddings must be non-negative multiples of 8");
  if (!c.seqused.empty() && static_cast<int>(c.seqused.size()) != c.batch())
    fail("seqused needs one length per sequence");
  for (int used : c.seqused)
    if (used < 0) fail("seqused lengths must be >= 0");
  if (c.paged()) {
    if (c.page_size % 8 != 0) fail("page_size must be a multiple of 8");
    if (c.pages_per_seq < 1) fail("a paged case needs pages_per_seq >= 1");
    if (!c.seqlens_k.empty()) fail("a paged case takes its lengths from seqused, not seqlens_k");
    for (int used : c.seqused)
      if (used > c.pages_per_seq * c.page_size) fail("seqused lengths must fit the capacity");
  } else {
    if (static_cast<int>(c.seqlens_k.size()) != c.batch())
      fail("a dense case needs one key length per sequence");
    for (int length : c.seqlens_k)
      if (length < 0) fail("key lengths must be >= 0");
    if (c.total_k() < 1) fail("needs at least one key (buffers of 0 bytes)");
    if (c.spare_pages != 0 || c.pages_per_seq != 0) fail("pages need a paged case");
  }
}

std::vector<std::int32_t> prefix_sums(const std::vector<int>& lengths) {
  std::vector<std::int32_t> cu(lengths.size() + 1, 0);
  for (std::size_t b = 0; b < lengths.size(); ++b) cu[b + 1] = cu[b] + lengths[b];
  return cu;
}

// Where key j of sequence b lives in the K/V store: (index 0, index 1) of its view.
std::pair<std::int64_t, std::int64_t> key_slot(const HostVarlen& kv, int b, int j) {
  const VarlenCase& c = kv.shape;
  if (!c.paged()) return {0, kv.cu_seqlens_k[at(b)] + j};
  const auto page = kv.page_table[at(b * c.pages_per_seq + j / c.page_size)];
  return {page, j % c.page_size};
}

// [1, total_q, heads, head_dim] with the case's head and row paddings.
HostTensor packed_rows(const VarlenCase& c) {
  HostTensor t;
  t.view.dtype = c.dtype;
  t.view.shape = {1, c.total_q(), c.heads_q, c.head_dim};
  const std::int64_t head_stride = c.head_dim + c.head_padding;
  const std::int64_t row_stride = c.heads_q * head_stride + c.row_padding;
  t.view.stride = {c.total_q() * row_stride, row_stride, head_stride, 1};
  t.bits.resize(static_cast<std::size_t>(c.total_q() * row_stride));
  return t;
}

}  // namespace

int VarlenCase::total_q() const {
  return std::accumulate(seqlens_q.begin(), seqlens_q.end(), 0) + tail_rows;
}

int VarlenCase::total_k() const {
  return paged() ? 0 : std::accumulate(seqlens_k.begin(), seqlens_k.end(), 0);
}

int VarlenCase::capacity(int b) const {
  return paged() ? pages_per_seq * page_size : seqlens_k[at(b)];
}

int VarlenCase::length(int b) const {
  return seqused.empty() ? capacity(b) : std::min(seqused[at(b)], capacity(b));
}

int VarlenCase::max_seqlen_q() const {
  return seqlens_q.empty() ? 0 : *std::max_element(seqlens_q.begin(), seqlens_q.end());
}

int VarlenCase::max_seqlen_k() const {
  int longest = 0;
  for (int b = 0; b < batch(); ++b) longest = std::max(longest, capacity(b));
  return longest;
}

int VarlenCase::rows_without_keys(int b) const {
  const int lq = seqlens_q[at(b)], lk = length(b);
  int empty = 0;
  for (int i = 0; i < lq; ++i) {
    const int visible = causal ? std::min(lk, i + 1 + lk - lq) : lk;
    empty += visible <= 0;
  }
  return empty;
}

std::string VarlenCase::describe() const {
  std::string kind = paged() ? fmt::format("paged{} {} x{} pool{}", page_size,
                                           head_major ? "hnd" : "nhd", pages_per_seq, num_pages())
                             : fmt::format("dense {} k[{}]", head_major ? "bhsd" : "bshd",
                                           fmt::join(seqlens_k, ","));
  std::string used = seqused.empty() ? "" : fmt::format(" seqused[{}]", fmt::join(seqused, ","));
  std::string padding =
      head_padding + row_padding + tail_rows == 0
          ? ""
          : fmt::format(" q/out pad h+{} s+{} tail{}", head_padding, row_padding, tail_rows);
  return fmt::format("varlen b{} hq{} hkv{} d{} {} {} q[{}] {}{}{}", batch(), heads_q, heads_kv,
                     head_dim, causal ? "causal" : "full", to_string(dtype),
                     fmt::join(seqlens_q, ","), kind, used, padding);
}

HostVarlen HostVarlen::random(const VarlenCase& shape, std::mt19937& rng) {
  check_case(shape);
  const VarlenCase& c = shape;
  HostVarlen h;
  h.shape = c;
  h.cu_seqlens_q = prefix_sums(c.seqlens_q);
  h.cu_seqlens_k = c.paged() ? std::vector<std::int32_t>{} : prefix_sums(c.seqlens_k);

  // q: random where a sequence owns the element, NaN in the gaps and tail rows.
  h.q = packed_rows(c);
  HostTensor values = h.q;
  values.fill_random(rng);
  h.q.fill(kNaN16);
  const int owned_rows = h.cu_seqlens_q.back();
  for (std::int64_t r = 0; r < owned_rows; ++r)
    for (std::int64_t hd = 0; hd < c.heads_q; ++hd)
      for (std::int64_t d = 0; d < c.head_dim; ++d) {
        const auto o = static_cast<std::size_t>(h.q.offset(0, r, hd, d));
        h.q.bits[o] = values.bits[o];
      }

  const std::int64_t rows0 = c.paged() ? c.num_pages() : 1;
  const std::int64_t rows1 = c.paged() ? c.page_size : c.total_k();
  h.k = HostTensor::make(c.dtype, rows0, rows1, c.heads_kv, c.head_dim, c.head_major);
  h.v = h.k;
  h.k.fill_random(rng);
  h.v.fill_random(rng);
  h.seqused.assign(c.seqused.begin(), c.seqused.end());
  if (c.paged())
    h.page_table = shuffled_page_table(c.num_pages(), c.batch() * c.pages_per_seq, rng);
  // NaN past seqused_k and in spare pages.
  poison_unowned_slots(
      h.k, h.v, c.batch(), [&](int b) { return c.length(b); },
      [&](int b, int j) { return key_slot(h, b, j); });
  return h;
}

HostTensor HostVarlen::sequence_rows(const HostTensor& packed, int b) const {
  const int first = cu_seqlens_q[at(b)], count = shape.seqlens_q[at(b)];
  HostTensor rows =
      HostTensor::make(shape.dtype, 1, count, shape.heads_q, shape.head_dim, /*bhsd=*/false);
  for (int i = 0; i < count; ++i)
    for (std::int64_t h = 0; h < shape.heads_q; ++h)
      for (std::int64_t d = 0; d < shape.head_dim; ++d)
        rows.bits[static_cast<std::size_t>(rows.offset(0, i, h, d))] =
            packed.bits[static_cast<std::size_t>(packed.offset(0, first + i, h, d))];
  return rows;
}

std::vector<float> HostVarlen::sequence_lse(const std::vector<float>& lse, int b) const {
  const int first = cu_seqlens_q[at(b)], count = shape.seqlens_q[at(b)];
  const std::size_t total = static_cast<std::size_t>(shape.total_q());
  std::vector<float> rows;
  rows.reserve(static_cast<std::size_t>(shape.heads_q) * at(count));
  for (int h = 0; h < shape.heads_q; ++h)
    for (int i = 0; i < count; ++i) rows.push_back(lse[at(h) * total + at(first + i)]);
  return rows;
}

HostTensor HostVarlen::sequence_keys(const HostTensor& store, int b) const {
  const int count = shape.length(b);
  HostTensor keys =
      HostTensor::make(shape.dtype, 1, count, shape.heads_kv, shape.head_dim, /*bhsd=*/false);
  for (int j = 0; j < count; ++j) {
    const auto [i0, i1] = key_slot(*this, b, j);
    for (std::int64_t h = 0; h < shape.heads_kv; ++h)
      for (std::int64_t d = 0; d < shape.head_dim; ++d)
        keys.bits[static_cast<std::size_t>(keys.offset(0, j, h, d))] =
            store.bits[static_cast<std::size_t>(store.offset(i0, i1, h, d))];
  }
  return keys;
}

std::vector<Reference> HostVarlen::reference(std::optional<double> softmax_scale,
                                             const ScoreMods& mods) const {
  const double scale = softmax_scale.value_or(1.0 / std::sqrt(static_cast<double>(shape.head_dim)));
  std::vector<Reference> refs;
  for (int b = 0; b < shape.batch(); ++b) {
    ScoreMods sequence_mods = mods;
    sequence_mods.first_batch = mods.first_batch + b;
    refs.push_back(reference_attention(sequence_rows(q, b), sequence_keys(k, b),
                                       sequence_keys(v, b), scale, shape.causal, sequence_mods));
  }
  return refs;
}

std::vector<bool> HostVarlen::written_out() const {
  std::vector<bool> written(q.bits.size(), false);
  const int owned_rows = cu_seqlens_q.back();
  for (std::int64_t r = 0; r < owned_rows; ++r)
    for (std::int64_t h = 0; h < shape.heads_q; ++h)
      for (std::int64_t d = 0; d < shape.head_dim; ++d)
        written[static_cast<std::size_t>(q.offset(0, r, h, d))] = true;
  return written;
}

std::vector<bool> HostVarlen::written_lse() const {
  std::vector<bool> written(lse_count(shape), false);
  const std::size_t total = static_cast<std::size_t>(shape.total_q());
  for (int h = 0; h < shape.heads_q; ++h)
    for (int r = 0; r < cu_seqlens_q.back(); ++r) written[at(h) * total + at(r)] = true;
  return written;
}

VarlenDeviceProblem::VarlenDeviceProblem(const Engine& engine, const HostVarlen& host,
                                         unsigned char poison_byte)
    : DeviceKvInputs(engine, host.q, host.k, host.v, host.page_table, host.seqused,
                     lse_count(host.shape), poison_byte),
      shape_(host.shape),
      cu_q_(engine, host.cu_seqlens_q.size() * sizeof(std::int32_t)),
      cu_k_(engine, host.cu_seqlens_q.size() * sizeof(std::int32_t)) {
  cu_q_.upload(host.cu_seqlens_q.data(), cu_q_.size());
  // A paged case has no key packing; its cu_seqlens_k buffer (for refusal tests) packs the
  // capacities.
  std::vector<int> capacities;
  for (int b = 0; b < shape_.batch(); ++b) capacities.push_back(shape_.capacity(b));
  const std::vector<std::int32_t> cu_k =
      shape_.paged() ? prefix_sums(capacities) : host.cu_seqlens_k;
  cu_k_.upload(cu_k.data(), cu_k_.size());
}

const std::int32_t* VarlenDeviceProblem::cu_seqlens_q() const {
  return static_cast<const std::int32_t*>(cu_q_.data());
}

const std::int32_t* VarlenDeviceProblem::cu_seqlens_k() const {
  return static_cast<const std::int32_t*>(cu_k_.data());
}

VarlenBatch VarlenDeviceProblem::varlen() const {
  VarlenBatch batch;
  batch.cu_seqlens_q = cu_seqlens_q();
  batch.cu_seqlens_k = shape_.paged() ? nullptr : cu_seqlens_k();
  batch.batch = shape_.batch();
  batch.max_seqlen_q = shape_.max_seqlen_q();
  batch.max_seqlen_k = shape_.max_seqlen_k();
  return batch;
}

}  // namespace flashjit::test

#include "kv_problem.hpp"

#include "kv_storage.hpp"

#include <fmt/format.h>
#include <fmt/ranges.h>

#include <algorithm>
#include <cmath>
#include <numeric>
#include <stdexcept>

namespace flashjit::test {
namespace {

std::size_t lse_count(const KvCase& c) {
  return static_cast<std::size_t>(c.batch) * c.heads_q * c.seqlen_q;
}

void check_case(const KvCase& c) {
  auto fail = [&](const std::string& what) {
    throw std::invalid_argument(fmt::format("KvCase {}: {}", c.describe(), what));
  };
  if (c.batch < 1 || c.heads_q < 1 || c.heads_kv < 1 || c.seqlen_q < 1 || c.capacity < 1)
    fail("sizes must be positive");
  if (c.heads_q % c.heads_kv != 0) fail("heads_q must be a multiple of heads_kv");
  if (c.paged() && c.capacity % c.page_size != 0) fail("capacity must be a page multiple");
  if (!c.paged() && c.spare_pages != 0) fail("spare pages need a paged cache");
  if (!c.seqused.empty() && static_cast<int>(c.seqused.size()) != c.batch)
    fail("seqused needs one length per sequence");
  for (int length : c.seqused)
    if (length < 0 || length > c.capacity) fail("seqused lengths must be in [0, capacity]");
}

// Where key j of sequence b lives in the K/V store: (index 0, index 1) of its view.
std::pair<std::int64_t, std::int64_t> key_slot(const HostKv& kv, int b, int j) {
  const KvCase& c = kv.shape;
  if (!c.paged()) return {b, j};
  const auto page =
      kv.page_table[static_cast<std::size_t>(b * c.pages_per_seq() + j / c.page_size)];
  return {page, j % c.page_size};
}

}  // namespace

std::string KvCase::describe() const {
  std::string kind =
      paged() ? fmt::format("paged{} {} pool{}", page_size, head_major ? "hnd" : "nhd", num_pages())
              : fmt::format("dense {}", head_major ? "bhsd" : "bshd");
  std::string used = seqused.empty() ? "" : fmt::format(" seqused[{}]", fmt::join(seqused, ","));
  return fmt::format("b{} hq{} hkv{} sq{} cap{} d{} {} {} {}{}", batch, heads_q, heads_kv, seqlen_q,
                     capacity, head_dim, causal ? "causal" : "full", to_string(dtype), kind, used);
}

HostKv HostKv::random(const KvCase& shape, std::mt19937& rng) {
  check_case(shape);
  const KvCase& c = shape;
  HostKv kv;
  kv.shape = c;
  kv.q = HostTensor::make(c.dtype, c.batch, c.seqlen_q, c.heads_q, c.head_dim, c.head_major);
  const std::int64_t rows0 = c.paged() ? c.num_pages() : c.batch;
  const std::int64_t rows1 = c.paged() ? c.page_size : c.capacity;
  kv.k = HostTensor::make(c.dtype, rows0, rows1, c.heads_kv, c.head_dim, c.head_major);
  kv.v = kv.k;
  kv.q.fill_random(rng);
  kv.k.fill_random(rng);
  kv.v.fill_random(rng);
  kv.seqused.assign(c.seqused.begin(), c.seqused.end());
  if (c.paged())
    kv.page_table = shuffled_page_table(c.num_pages(), c.batch * c.pages_per_seq(), rng);
  poison_unowned_slots(
      kv.k, kv.v, c.batch, [&](int b) { return kv.length(b); },
      [&](int b, int j) { return key_slot(kv, b, j); });
  return kv;
}

int HostKv::length(int b) const {
  return seqused.empty() ? shape.capacity : seqused[static_cast<std::size_t>(b)];
}

HostTensor HostKv::gather(const HostTensor& store, int b, int first, int count) const {
  HostTensor keys =
      HostTensor::make(shape.dtype, 1, count, shape.heads_kv, shape.head_dim, /*bhsd=*/false);
  for (int j = 0; j < count; ++j) {
    const auto [i0, i1] = key_slot(*this, b, first + j);
    for (std::int64_t h = 0; h < shape.heads_kv; ++h)
      for (std::int64_t d = 0; d < shape.head_dim; ++d)
        keys.bits[static_cast<std::size_t>(keys.offset(0, j, h, d))] =
            store.bits[static_cast<std::size_t>(store.offset(i0, i1, h, d))];
  }
  return keys;
}

Reference HostKv::reference(std::optional<double> softmax_scale, const ScoreMods& mods) const {
  std::vector<HostTensor> keys, values;
  for (int b = 0; b < shape.batch; ++b) {
    keys.push_back(gather(k, b, 0, length(b)));
    values.push_back(gather(v, b, 0, length(b)));
  }
  const double scale = softmax_scale.value_or(1.0 / std::sqrt(static_cast<double>(shape.head_dim)));
  return reference_per_sequence(q, keys, values, scale, shape.causal, mods);
}

Reference reference_per_sequence(const HostTensor& q, const std::vector<HostTensor>& k,
                                 const std::vector<HostTensor>& v, double softmax_scale,
                                 bool causal, const ScoreMods& mods) {
  const auto B = q.view.shape[0], SQ = q.view.shape[1], HQ = q.view.shape[2], D = q.view.shape[3];
  Reference ref;
  for (std::int64_t b = 0; b < B; ++b) {
    HostTensor q_b = HostTensor::make(q.view.dtype, 1, SQ, HQ, D, /*bhsd=*/false);
    for (std::int64_t i = 0; i < SQ; ++i)
      for (std::int64_t h = 0; h < HQ; ++h)
        for (std::int64_t d = 0; d < D; ++d)
          q_b.bits[static_cast<std::size_t>(q_b.offset(0, i, h, d))] =
              q.bits[static_cast<std::size_t>(q.offset(b, i, h, d))];
    ScoreMods sequence_mods = mods;
    sequence_mods.first_batch = mods.first_batch + static_cast<int>(b);
    const Reference one =
        reference_attention(q_b, k[static_cast<std::size_t>(b)], v[static_cast<std::size_t>(b)],
                            softmax_scale, causal, sequence_mods);
    ref.out.insert(ref.out.end(), one.out.begin(), one.out.end());
    ref.lse.insert(ref.lse.end(), one.lse.begin(), one.lse.end());
  }
  return ref;
}

KvDeviceProblem::KvDeviceProblem(const Engine& engine, const HostKv& host,
                                 unsigned char poison_byte)
    : DeviceKvInputs(engine, host.q, host.k, host.v, host.page_table, host.seqused,
                     lse_count(host.shape), poison_byte),
      shape_(host.shape) {}

void KvDeviceProblem::upload(const HostKv& host) {
  const KvCase& c = host.shape;
  const bool same = c.batch == shape_.batch && c.heads_q == shape_.heads_q &&
                    c.heads_kv == shape_.heads_kv && c.seqlen_q == shape_.seqlen_q &&
                    c.capacity == shape_.capacity && c.head_dim == shape_.head_dim &&
                    c.dtype == shape_.dtype && c.page_size == shape_.page_size &&
                    c.head_major == shape_.head_major && c.spare_pages == shape_.spare_pages &&
                    c.seqused.empty() == shape_.seqused.empty();
  if (!same)
    throw std::invalid_argument(
        fmt::format("KvDeviceProblem of {} cannot take {}", shape_.describe(), c.describe()));
  DeviceKvInputs::upload(host.q, host.k, host.v, host.page_table, host.seqused);
  shape_ = c;
}

}  // namespace flashjit::test

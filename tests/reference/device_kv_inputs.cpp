#include "device_kv_inputs.hpp"

namespace flashjit::test {
namespace {

std::size_t bytes_of(const std::vector<std::int32_t>& values) {
  return values.size() * sizeof(std::int32_t);
}

std::optional<DeviceBuffer> buffer_for(const Engine& engine,
                                       const std::vector<std::int32_t>& values) {
  if (values.empty()) return std::nullopt;
  return std::optional<DeviceBuffer>(std::in_place, engine, bytes_of(values));
}

const std::int32_t* data_of(const std::optional<DeviceBuffer>& buffer) {
  return buffer ? static_cast<const std::int32_t*>(buffer->data()) : nullptr;
}

}  // namespace

DeviceKvInputs::DeviceKvInputs(const Engine& engine, const HostTensor& q, const HostTensor& k,
                               const HostTensor& v, const std::vector<std::int32_t>& page_table,
                               const std::vector<std::int32_t>& seqused, std::size_t lse_count,
                               unsigned char poison_byte)
    : q_view_(q.view),
      k_view_(k.view),
      q_(engine, q.bytes()),
      k_(engine, k.bytes()),
      v_(engine, v.bytes()),
      outputs_(engine, q.view, q.bits.size(), lse_count),
      page_table_(buffer_for(engine, page_table)),
      seqused_(buffer_for(engine, seqused)) {
  upload(q, k, v, page_table, seqused);
  poison(poison_byte);
}

void DeviceKvInputs::upload(const HostTensor& q, const HostTensor& k, const HostTensor& v,
                            const std::vector<std::int32_t>& page_table,
                            const std::vector<std::int32_t>& seqused) {
  q_.upload(q.bits.data(), q.bytes());
  k_.upload(k.bits.data(), k.bytes());
  v_.upload(v.bits.data(), v.bytes());
  if (page_table_) page_table_->upload(page_table.data(), bytes_of(page_table));
  if (seqused_) seqused_->upload(seqused.data(), bytes_of(seqused));
}

const std::int32_t* DeviceKvInputs::seqused_k() const { return data_of(seqused_); }

const std::int32_t* DeviceKvInputs::page_table() const { return data_of(page_table_); }

KVCache DeviceKvInputs::kv_cache(bool paged, std::int64_t pages_per_seq) const {
  if (paged) return KVCache::paged(k(), v(), page_table(), pages_per_seq, seqused_k());
  return KVCache::dense(k(), v(), seqused_k());
}

}  // namespace flashjit::test

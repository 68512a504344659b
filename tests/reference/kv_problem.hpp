// A serving-shaped forward problem: queries against a KV cache that is dense or paged (NHD or HND
// pages behind a shuffled page table), with optional per-sequence key counts (seqused_k). The host
// copy feeds the float64 reference (pages gathered back into dense sequences); the device copy
// feeds Engine::forward's KVCache form and can be refilled in place (CUDA graph replays).
#pragma once

#include <cstdint>
#include <optional>
#include <random>
#include <string>
#include <vector>

#include "device_kv_inputs.hpp"
#include "flashjit/flashjit.hpp"
#include "reference.hpp"

namespace flashjit::test {

struct KvCase {
  int batch = 1, heads_q = 1, heads_kv = 1, seqlen_q = 1;
  // Keys each sequence can hold: seqlen_k of a dense cache, pages_per_seq * page_size of a paged
  // one (then a multiple of page_size).
  int capacity = 1;
  int head_dim = 128;
  bool causal = false;
  DType dtype = DType::bf16;
  int page_size = 0;         // 0: dense K/V [batch, capacity, heads_kv, head_dim]
  bool head_major = false;   // HND pages (TensorView::bhsd); for a dense cache, BHSD q/k/v/out
  int spare_pages = 0;       // pages of the pool that no sequence's page table names
  std::vector<int> seqused;  // valid keys per sequence (seqused_k); empty: all have `capacity`

  bool paged() const { return page_size > 0; }
  int pages_per_seq() const { return paged() ? capacity / page_size : 0; }
  int num_pages() const { return batch * pages_per_seq() + spare_pages; }
  int rows_per_kv_head() const { return seqlen_q * heads_q / heads_kv; }
  std::string describe() const;
};

struct HostKv {
  KvCase shape;
  HostTensor q;  // [batch, seqlen_q, heads_q, head_dim]; out takes the same view
  // Dense [batch, capacity, heads_kv, head_dim], or the page pool [num_pages, page_size,
  // heads_kv, head_dim].
  HostTensor k, v;
  std::vector<std::int32_t> page_table;  // [batch, pages_per_seq], paged only
  std::vector<std::int32_t> seqused;     // [batch], when the case has seqused

  // q, k, v ~ N(0, 1) and a fresh random permutation of the pool as page table. Every K/V element
  // that is no sequence's valid key (past seqused_k, spare pages) is NaN, so a kernel that lets
  // one reach P·V (as 0 · NaN) or reads the wrong page shows.
  // Throws std::invalid_argument for an inconsistent case (capacity not a page multiple, ...).
  static HostKv random(const KvCase& shape, std::mt19937& rng);

  int length(int b) const;  // valid keys of sequence b
  // Keys [first, first + count) of sequence b from `store` (k or v), gathered through the page
  // table when paged, as a dense BSHD [1, count, heads_kv, head_dim] tensor.
  HostTensor gather(const HostTensor& store, int b, int first, int count) const;
  // The float64 reference over each sequence's valid keys; scale default 1/sqrt(head_dim).
  Reference reference(std::optional<double> softmax_scale = {}, const ScoreMods& mods = {}) const;
};

// Float64 attention of each sequence b of q against its own keys k[b], v[b] ([1, L_b, heads_kv,
// head_dim], L_b may be 0), causal aligned bottom-right to L_b; laid out as reference_attention
// lays out one batch (out [b, sq, hq, d], lse [b, hq, sq]; rows that see no key: 0 and -inf).
// The user functions of `mods` see sequence b as batch b.
Reference reference_per_sequence(const HostTensor& q, const std::vector<HostTensor>& k,
                                 const std::vector<HostTensor>& v, double softmax_scale,
                                 bool causal, const ScoreMods& mods = {});

// A HostKv on the GPU, with an output and LSE filled with a poison byte before each run.
// (q, k, v, out, lse [batch, heads_q, seqlen_q], page_table, seqused_k: DeviceKvInputs.)
class KvDeviceProblem : public DeviceKvInputs {
 public:
  KvDeviceProblem(const Engine& engine, const HostKv& host, unsigned char poison = 0xff);

  // New contents of the same shape into the same buffers (synchronous copies; synchronize the
  // streams that use them first). Throws std::invalid_argument for another shape.
  void upload(const HostKv& host);

  KVCache kv() const { return kv_cache(shape_.paged(), shape_.pages_per_seq()); }

 private:
  KvCase shape_;
};

}  // namespace flashjit::test

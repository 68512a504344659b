// A variable-length (varlen) batch: sequences of different query and key lengths packed along the
// seqlen dimension (VarlenBatch), against a dense packed KV cache ([1, total_k, heads_kv,
// head_dim] with cu_seqlens_k) or a paged one (page table rows per sequence, lengths from
// seqused_k). q and out may have padded strides and rows past the last sequence; whatever no
// sequence owns (those gaps, K/V slots that hold no valid key) is NaN in the inputs, and the output
// and LSE elements no sequence writes must keep their poison. The host copy feeds the float64
// reference, one sequence at a time.
#pragma once

#include <cstdint>
#include <optional>
#include <random>
#include <string>
#include <vector>

#include "device_kv_inputs.hpp"
#include "flashjit/device_memory.hpp"
#include "flashjit/flashjit.hpp"
#include "reference.hpp"

namespace flashjit::test {

struct VarlenCase {
  int heads_q = 1, heads_kv = 1, head_dim = 128;
  bool causal = false;
  DType dtype = DType::bf16;
  std::vector<int> seqlens_q;  // queries per sequence; the batch is its size (0 allowed)
  // Dense: keys per sequence, packed one after the other (cu_seqlens_k); 0 allowed. Paged: unused.
  std::vector<int> seqlens_k;
  // seqused_k per sequence, empty: none. Dense: caps a sequence at min(seqused, seqlens_k) keys
  // (may exceed seqlens_k); paged: the sequence's keys, at most the capacity.
  std::vector<int> seqused;
  int page_size = 0;        // 0: dense packed K/V
  int pages_per_seq = 0;    // paged: page table columns (capacity pages_per_seq * page_size)
  int spare_pages = 0;      // paged: pool pages no page table names
  bool head_major = false;  // HND pages (TensorView::bhsd); dense: K/V as a bhsd-strided view
  // q and out: elements added to the head stride and to the row (seqlen) stride (multiples of 8),
  // and rows after the last sequence's that belong to none (in total_q, never written).
  int head_padding = 0, row_padding = 0, tail_rows = 0;

  int batch() const { return static_cast<int>(seqlens_q.size()); }
  bool paged() const { return page_size > 0; }
  int num_pages() const { return batch() * pages_per_seq + spare_pages; }
  int total_q() const;        // every sequence's queries plus tail_rows
  int total_k() const;        // dense: every sequence's keys
  int capacity(int b) const;  // key slots of sequence b: seqlens_k[b], or the page table row's
  int length(int b) const;    // keys sequence b attends over (capacity capped by seqused)
  int max_seqlen_q() const;   // the longest query sequence
  int max_seqlen_k() const;   // the largest capacity
  // Query rows (per head) of sequence b that see no key: 0 and -inf.
  int rows_without_keys(int b) const;
  std::string describe() const;
};

struct HostVarlen {
  VarlenCase shape;
  HostTensor q;  // [1, total_q, heads_q, head_dim] with the case's strides; out takes this view
  // Dense [1, total_k, heads_kv, head_dim], or the page pool [num_pages, page_size, heads_kv,
  // head_dim].
  HostTensor k, v;
  std::vector<std::int32_t> cu_seqlens_q, cu_seqlens_k;  // [batch + 1]; cu_seqlens_k dense only
  std::vector<std::int32_t> page_table;                  // [batch, pages_per_seq], paged only
  std::vector<std::int32_t> seqused;                     // [batch], when the case has seqused

  // q, k, v ~ N(0, 1) (page table: a fresh permutation of the pool); NaN in every element of q
  // that no sequence owns (stride gaps, tail rows) and every K/V slot that is no valid key.
  // Throws std::invalid_argument for an inconsistent case.
  static HostVarlen random(const VarlenCase& shape, std::mt19937& rng);

  // Rows of sequence b from a tensor in q's view (q, or what the GPU wrote into out), as a
  // contiguous BSHD [1, seqlens_q[b], heads_q, head_dim] tensor.
  HostTensor sequence_rows(const HostTensor& packed, int b) const;
  // Sequence b's LSE from a varlen LSE [heads_q, total_q], laid out [1, heads_q, seqlens_q[b]].
  std::vector<float> sequence_lse(const std::vector<float>& lse, int b) const;
  // Sequence b's valid keys (or values) from `store`, as BSHD [1, length(b), heads_kv, head_dim].
  HostTensor sequence_keys(const HostTensor& store, int b) const;
  // The float64 reference of each sequence over its valid keys (causal aligned bottom-right to
  // them), laid out for sequence_rows / sequence_lse; scale default 1/sqrt(head_dim). The user
  // functions of `mods` see sequence b as batch b, its positions from 0.
  std::vector<Reference> reference(std::optional<double> softmax_scale = {},
                                   const ScoreMods& mods = {}) const;
  // Which elements of out's bits, and which LSE entries, some sequence writes.
  std::vector<bool> written_out() const;
  std::vector<bool> written_lse() const;
};

// A HostVarlen on the GPU, with an output and LSE filled with a poison byte before each run.
// (q, k, v, out, lse [heads_q, total_q], page_table, seqused_k: DeviceKvInputs.)
class VarlenDeviceProblem : public DeviceKvInputs {
 public:
  VarlenDeviceProblem(const Engine& engine, const HostVarlen& host, unsigned char poison = 0xff);

  KVCache kv() const { return kv_cache(shape_.paged(), shape_.pages_per_seq); }
  // The batch with tight max_seqlen hints (the longest sequence's), cu_seqlens_k only when dense.
  VarlenBatch varlen() const;
  const std::int32_t* cu_seqlens_q() const;
  const std::int32_t* cu_seqlens_k() const;  // the dense packing's (set for a paged case too)

 private:
  VarlenCase shape_;
  DeviceBuffer cu_q_, cu_k_;
};

}  // namespace flashjit::test

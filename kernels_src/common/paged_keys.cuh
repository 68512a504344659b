// Where a key of a paged KV cache lives (FmhaParams::page_table): key j of sequence b is row
// j % page_size of page page_table[b * page_table_stride + j / page_size].
#pragma once

#include "common/params.cuh"

namespace flashjit {

// A power-of-two page size divides by shifting: its log2, else -1.
__device__ __forceinline__ int page_shift_of(const FmhaParams& p) {
  return (p.page_size & (p.page_size - 1)) == 0 ? __ffs(p.page_size) - 1 : -1;
}

// The page-table slot of key `key`; page_shift >= 0: the page size is 2^page_shift.
__device__ __forceinline__ int page_of(const FmhaParams& p, int key, int page_shift) {
  return page_shift >= 0 ? key >> page_shift : key / p.page_size;
}

// Where key `key` of sequence `batch` lives: (batch, key) in a dense cache, (page, row in page)
// in a paged one.
struct KvRow {
  long long block;  // index along stride_b
  int row;          // index along stride_s
};
template <bool Paged>
__device__ __forceinline__ KvRow locate_key(const FmhaParams& p, int batch, int key,
                                            int page_shift, int dense_block, int dense_start) {
  if (!Paged) return {dense_block, dense_start + key};
  const int index = page_of(p, key, page_shift);
  return {__ldg(p.page_table + batch * p.page_table_stride + index), key - index * p.page_size};
}

}  // namespace flashjit

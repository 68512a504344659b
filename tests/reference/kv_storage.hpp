// What the KV and varlen test problems share about K/V storage: a shuffled page table, and NaN in
// every slot no sequence owns, so a kernel that reads past a sequence's keys shows.
#pragma once

#include <algorithm>
#include <cstdint>
#include <numeric>
#include <random>
#include <vector>

#include "reference.hpp"

namespace flashjit::test {

inline constexpr std::uint16_t kNaN16 = 0xffff;  // NaN in bf16 and fp16

// The first `used` entries of a random permutation of `pool` pages.
inline std::vector<std::int32_t> shuffled_page_table(std::int64_t pool, std::int64_t used,
                                                     std::mt19937& rng) {
  std::vector<std::int32_t> pages(static_cast<std::size_t>(pool));
  std::iota(pages.begin(), pages.end(), 0);
  std::shuffle(pages.begin(), pages.end(), rng);
  pages.resize(static_cast<std::size_t>(used));
  return pages;
}

// Sets every element of k and v (same views) to NaN whose slot (index along dims 0 and 1) holds
// no key j < length(b) of any sequence b; slot(b, j) names the slot of key j of sequence b.
template <typename Length, typename Slot>
void poison_unowned_slots(HostTensor& k, HostTensor& v, int batch, Length length, Slot slot) {
  const std::int64_t rows0 = k.view.shape[0], rows1 = k.view.shape[1];
  std::vector<bool> owned(static_cast<std::size_t>(rows0 * rows1), false);
  for (int b = 0; b < batch; ++b)
    for (int j = 0; j < length(b); ++j) {
      const auto [i0, i1] = slot(b, j);
      owned[static_cast<std::size_t>(i0 * rows1 + i1)] = true;
    }
  for (std::int64_t i0 = 0; i0 < rows0; ++i0)
    for (std::int64_t i1 = 0; i1 < rows1; ++i1) {
      if (owned[static_cast<std::size_t>(i0 * rows1 + i1)]) continue;
      for (HostTensor* t : {&k, &v})
        for (std::int64_t h = 0; h < t->view.shape[2]; ++h)
          for (std::int64_t d = 0; d < t->view.shape[3]; ++d)
            t->bits[static_cast<std::size_t>(t->offset(i0, i1, h, d))] = kNaN16;
    }
}

}  // namespace flashjit::test

// How many CTAs share the keys of one (sequence, KV head, row block) in the decode family.
#pragma once

#include "core/problem.hpp"
#include "decode/shape.cuh"
#include "flashjit/flashjit.hpp"

namespace flashjit::detail {

// problem.num_splits when the caller set it; else the split count that minimizes the estimated
// time, waves x (key tiles per split + fixed cost per CTA), over 1..min(128, key tiles): few splits
// when batch x KV heads already fill the GPU, many for one long sequence (docs/serving.md).
int decode_num_splits(const Variant& variant, const ForwardProblem& problem,
                      const DeviceInfo& device);
// The decode kernel's geometry for a variant of either decode family (defined in decode.cpp).
DecodeShape decode_shape(const Variant& variant);
// CTAs of this shape (its shared memory, its row groups of 4 warps) that fit on one SM of the
// device at once.
int decode_ctas_per_sm(const DecodeShape& shape, const DeviceInfo& device);

}  // namespace flashjit::detail

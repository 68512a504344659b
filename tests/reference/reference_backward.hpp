// Host-side attention backward in float64: the ground truth for Engine::backward. The gradients
// of L = Σ out∘dout for the forward (softmax scale, bottom-right causal, GQA/MQA, and the score
// variants and user functions of ScoreMods), from the same bf16/fp16 inputs the GPU reads.
#pragma once

#include <cstdint>
#include <vector>

#include "reference.hpp"

namespace flashjit::test {

struct ReferenceGradients {
  std::vector<double> dq;      // [b, sq, hq, d] contiguous
  std::vector<double> dk, dv;  // [b, sk, hkv, d] contiguous, summed over each GQA group
  // Which gradient rows are zero by the mask alone (not by cancellation), so a GPU must write
  // exact zeros there: query rows that see no key, keys that no row sees (all when sq is 0).
  std::vector<bool> query_sees_nothing;  // [sq]
  std::vector<bool> key_seen_by_none;    // [sk]
  std::vector<double> dsink;             // [hq] with ScoreMods::sink_logits, else empty
};

// dq, dk, dv of softmax(scale·q kᵀ [+ causal mask]) v given dout (q's shape), recomputing the
// forward in float64 (not from a GPU's rounded output):
//   P = softmax(scale·QKᵀ), dV = Pᵀ dO, dP = dO Vᵀ, D_i = Σ_j P_ij dP_ij (= rowsum(dO∘O)),
//   dS = P∘(dP − D), dQ = scale·dS K, dK = scale·dSᵀ Q.
// Causal: query i sees key j iff j <= i + sk - sq; the window and sink tokens as in ScoreMods. A
// row with no visible key has zero dq and adds nothing to dk and dv. Soft-capped, dS takes the
// cap's 1 - tanh² on its way to dq and dk; ALiBi is a constant bias; a learnable sink joins the
// denominator and gets dsink_h = -Σ_i exp(sink_h - LSE_i) D_i. A score_mod's derivative
// (ScoreMods::score_mod_grad, required with one) multiplies dS; mask_mod hides keys as in the
// forward. query_sees_nothing / key_seen_by_none then hold for every batch and head.
ReferenceGradients reference_attention_backward(const HostTensor& q, const HostTensor& k,
                                                const HostTensor& v, const HostTensor& dout,
                                                double softmax_scale, bool causal,
                                                const ScoreMods& mods = {});

}  // namespace flashjit::test

// The kernel families built into flashjit, and the checks and specs every caller shares: the
// CLI, the C API, precompile and forward all go through these, so they accept the same variants.
#pragma once

#include <string>
#include <string_view>
#include <vector>

#include "families/family.hpp"
#include "jit/kernel_spec.hpp"

namespace flashjit::detail {

// Fastest first: the dispatcher takes the first family that can run a problem.
const std::vector<const KernelFamily*>& registered_families();
// nullptr when no family has this name.
const KernelFamily* find_family(std::string_view name);
// "'<name>' is unknown: expected one of wgmma, mma, simt".
std::string unknown_family(std::string_view name);
// The family, else Error(invalid_argument) "<what> '<name>' is unknown: expected one of ...".
const KernelFamily& family_named(std::string_view name, std::string_view what);

// Throws Error(invalid_argument) naming what is wrong when the variant cannot be built.
void check_variant(const Variant& variant);
// Empty when the family handles every feature the problem uses (paged KV, seqused_k, varlen,
// the score variants, user functions, block masks, split-KV), else what it lacks ("has no
// ALiBi"): the forward's dispatcher and the backward's share it.
std::string missing_feature(const KernelFamily& family, const ForwardProblem& problem);
// Empty when the family can run the problem on a GPU of this arch (before its tile shape is
// chosen), else why not ("has no head_dim 96").
std::string why_family_cannot_run(const KernelFamily& family, const ForwardProblem& problem,
                                  std::string_view arch);
// The same on any arch the family runs on: its features, head dims and limits.
std::string why_family_cannot_take(const KernelFamily& family, const ForwardProblem& problem);
// What the JIT compiles for a checked variant.
KernelSpec kernel_spec(const Variant& variant);

// The head dims of every family, ascending; built once (validation reads it on every call).
const std::vector<int>& head_dims_of_all_families();

// The template arguments every backward dK/dV and dQ kernel takes after the element type:
// head_dim, tiles, then the variant flags causal, softcap, window, alibi, varlen.
std::string backward_template_arguments(const Variant& v);

Variant variant_of(const KernelFamily& family, std::string_view arch, DType dtype, int head_dim,
                   bool causal, TileConfig tiles, bool paged = false,
                   bool per_sequence_lengths = false, bool softcap = false, bool window = false,
                   bool sink = false, bool alibi = false, std::string_view user_functions = {});

}  // namespace flashjit::detail

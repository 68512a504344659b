#include "families/registry.hpp"

#include <fmt/format.h>
#include <fmt/ranges.h>

#include <algorithm>
#include <set>

#include "core/arch.hpp"

// The one list of families, fastest first. Adding a family: its folder under src/families/, its
// kernel under kernels_src/<family>/, and its entry here.
#define FLASHJIT_FAMILIES(X) \
  X(kDecodeTmaFamily) X(kWgmmaFamily) X(kDecodeFamily) X(kMmaFamily) X(kSimtFamily) X(kMergeFamily) \
  X(kBlockMaskFamily) X(kBwdWgmmaFusedFamily) X(kBwdWgmmaFamily) X(kBwdWgmmaDqFamily) X(kBwdMmaFamily) X(kBwdMmaDqFamily) \
  X(kBwdPrepFamily) X(kBwdConvertFamily) X(kBwdSinkFamily) X(kBwdBlockMaskFamily)

namespace flashjit::detail {

#define FLASHJIT_DECLARE_FAMILY(family) extern const KernelFamily family;
FLASHJIT_FAMILIES(FLASHJIT_DECLARE_FAMILY)
#undef FLASHJIT_DECLARE_FAMILY

const std::vector<const KernelFamily*>& registered_families() {
#define FLASHJIT_LIST_FAMILY(family) &family,
  static const std::vector<const KernelFamily*> families = {
      FLASHJIT_FAMILIES(FLASHJIT_LIST_FAMILY)};
#undef FLASHJIT_LIST_FAMILY
  return families;
}

const KernelFamily* find_family(std::string_view name) {
  for (const KernelFamily* family : registered_families())
    if (family->name == name) return family;
  return nullptr;
}

std::string unknown_family(std::string_view name) {
  std::vector<std::string_view> names;
  for (const KernelFamily* family : registered_families()) names.push_back(family->name);
  return fmt::format("'{}' is unknown: expected one of {}", name, fmt::join(names, ", "));
}

const KernelFamily& family_named(std::string_view name, std::string_view what) {
  if (const KernelFamily* family = find_family(name)) return *family;
  throw Error(ErrorCode::invalid_argument, fmt::format("{} {}", what, unknown_family(name)));
}

TileConfig TileTable::pick(const ForwardProblem& problem) const {
  for (int i = 0; i + 1 < count; ++i)
    if (problem.seqlen_k <= rules[i].max_seqlen_k &&
        problem.rows_per_kv_head() <= rules[i].max_rows_per_kv_head &&
        (!problem.paged || problem.page_size <= rules[i].max_page_size))
      return rules[i].tiles;
  return rules[count - 1].tiles;
}

void check_variant(const Variant& v) {
  auto fail = [&](const std::string& what) {
    throw Error(ErrorCode::invalid_argument, fmt::format("variant {}: {}", v.name(), what));
  };
  const KernelFamily* family = find_family(v.family);
  if (family == nullptr) fail(fmt::format("family {}", unknown_family(v.family)));
  if (!family->runs_on(v.arch)) fail(fmt::format("family {} does not run on {}", v.family, v.arch));
  if (std::find(family->head_dims.begin(), family->head_dims.end(), v.head_dim) ==
      family->head_dims.end())
    fail(fmt::format("family {} has no head_dim {}: expected one of {}", v.family, v.head_dim,
                     fmt::join(family->head_dims, ", ")));
  if (v.paged && !(family->features & kFeaturePagedKv))
    fail(fmt::format("family {} does not read paged KV caches", v.family));
  if (v.softcap && !(family->features & kFeatureSoftcap))
    fail(fmt::format("family {} has no soft-capped variants", v.family));
  if (v.window && !(family->features & kFeatureWindow))
    fail(fmt::format("family {} has no sliding-window variants", v.family));
  if (v.sink && !(family->features & kFeatureSink))
    fail(fmt::format("family {} has no sink variants", v.family));
  if (v.alibi && !(family->features & kFeatureAlibi))
    fail(fmt::format("family {} has no ALiBi variants", v.family));
  if (!v.user_functions.empty() && !(family->features & kFeatureUserFunctions))
    fail(fmt::format("family {} has no variants with user functions", v.family));
  if (family->role == FamilyRole::block_mask && v.user_functions.empty())
    fail(fmt::format("family {} builds the block masks of user functions: expected .user<hash>",
                     v.family));
  if (v.varlen && !family->varlen_variants)
    fail(
        fmt::format("family {} has no varlen variants (it takes sequence lengths at run time, "
                    "or none)",
                    v.family));
  if (std::string problem = family->check_tiles(v); !problem.empty()) fail(problem);
  // A kernel no GPU of the arch could launch is refused here, not cached.
  if (const int bytes = family->shared_bytes(v), most = max_shared_bytes_per_block(v.arch);
      bytes > most)
    fail(
        fmt::format("needs {} B of shared memory per block: expected at most {} (what {} GPUs "
                    "allow)",
                    bytes, most, v.arch));
}

std::string missing_feature(const KernelFamily& family, const ForwardProblem& problem) {
  if (problem.paged && !(family.features & kFeaturePagedKv)) return "reads no paged KV cache";
  if (problem.has_seqused && !(family.features & kFeatureSeqUsedK)) return "takes no seqused_k";
  if (problem.varlen && !(family.features & kFeatureVarlen)) return "takes no varlen batch";
  if (problem.softcap > 0.f && !(family.features & kFeatureSoftcap)) return "has no soft-capping";
  if (problem.window && !(family.features & kFeatureWindow)) return "has no sliding window";
  if (problem.sink && !(family.features & kFeatureSink)) return "has no attention sinks";
  if (problem.alibi && !(family.features & kFeatureAlibi)) return "has no ALiBi";
  if (!problem.user_functions.empty() && !(family.features & kFeatureUserFunctions))
    return "has no user functions";
  if (problem.block_mask && !(family.features & kFeatureBlockMask)) return "takes no block mask";
  if (problem.num_splits > 1 && !(family.features & kFeatureSplitKv))
    return "does not split keys (num_splits > 1)";
  return {};
}

std::string why_family_cannot_run(const KernelFamily& family, const ForwardProblem& problem,
                                  std::string_view arch) {
  if (!family.runs_on(arch)) return fmt::format("does not run on {}", arch);
  return why_family_cannot_take(family, problem);
}

std::string why_family_cannot_take(const KernelFamily& family, const ForwardProblem& problem) {
  if (family.role != FamilyRole::attention) return "is not an attention kernel";
  if (std::string missing = missing_feature(family, problem); !missing.empty()) return missing;
  if (std::find(family.head_dims.begin(), family.head_dims.end(), problem.head_dim) ==
      family.head_dims.end())
    return fmt::format("has no head_dim {}", problem.head_dim);
  return family.unsupported_reason(problem);
}

KernelSpec kernel_spec(const Variant& v) {
  const KernelFamily& family = family_named(v.family, "family");
  KernelSpec spec;
  spec.source_file = std::string(family.source_file);
  const std::string arguments =
      family.template_arguments
          ? family.template_arguments(v)
          : fmt::format("{}, {}, {}, {}, {}, {}, {}, {}, {}{}", v.head_dim, v.tile_m, v.tile_n,
                        v.stages, v.causal, v.softcap, v.window, v.sink, v.alibi,
                        family.varlen_variants ? fmt::format(", {}", v.varlen) : "");
  spec.name_expression =
      fmt::format("{}<flashjit::{}, {}>", family.kernel_template, to_string(v.dtype), arguments);
  // The kernels of these families end their template arguments with BlockMask (false unless given).
  if ((family.features & kFeatureBlockMask) && !v.user_functions.empty())
    spec.block_mask_name_expression = fmt::format("{}<flashjit::{}, {}, true>",
                                                  family.kernel_template, to_string(v.dtype),
                                                  arguments);
  spec.options = {"--gpu-architecture=" + v.arch, "-std=c++17", "--ptxas-options=-v", "-lineinfo",
                  "-default-device"};
  spec.dynamic_shared_bytes = family.shared_bytes(v);
  return spec;
}

std::string backward_template_arguments(const Variant& v) {
  return fmt::format("{}, {}, {}, {}, {}, {}, {}, {}, {}", v.head_dim, v.tile_m, v.tile_n,
                     v.stages, v.causal, v.softcap, v.window, v.alibi, v.varlen);
}

const std::vector<int>& head_dims_of_all_families() {
  static const std::vector<int> union_of_families = [] {
    std::set<int> dims;
    for (const KernelFamily* family : registered_families())
      dims.insert(family->head_dims.begin(), family->head_dims.end());
    return std::vector<int>(dims.begin(), dims.end());
  }();
  return union_of_families;
}

Variant variant_of(const KernelFamily& family, std::string_view arch, DType dtype, int head_dim,
                   bool causal, TileConfig tiles, bool paged, bool per_sequence_lengths,
                   bool softcap, bool window, bool sink, bool alibi,
                   std::string_view user_functions) {
  return Variant{std::string(family.name),
                 std::string(arch),
                 dtype,
                 head_dim,
                 tiles.tile_m,
                 tiles.tile_n,
                 tiles.stages,
                 causal,
                 paged,
                 per_sequence_lengths && family.varlen_variants,
                 softcap,
                 window,
                 sink,
                 alibi,
                 std::string(user_functions)};
}

}  // namespace flashjit::detail

namespace flashjit {

const std::vector<FamilyInfo>& families() {
  static const std::vector<FamilyInfo> infos = [] {
    std::vector<FamilyInfo> list;
    for (const detail::KernelFamily* family : detail::registered_families()) {
      FamilyInfo info{std::string(family->name),
                      family->role == detail::FamilyRole::attention,
                      family->role == detail::FamilyRole::backward ||
                          family->role == detail::FamilyRole::backward_dq ||
                          family->role == detail::FamilyRole::backward_rows,
                      std::string(family->summary),
                      {family->head_dims.begin(), family->head_dims.end()},
                      {},
                      (family->features & detail::kFeatureSoftcap) != 0,
                      (family->features & detail::kFeatureWindow) != 0,
                      (family->features & detail::kFeatureSink) != 0,
                      (family->features & detail::kFeatureAlibi) != 0,
                      (family->features & detail::kFeatureUserFunctions) != 0,
                      (family->features & detail::kFeatureBlockMask) != 0,
                      (family->features & detail::kFeaturePagedKv) != 0,
                      (family->features & detail::kFeatureVarlen) != 0,
                      (family->features & detail::kFeatureSplitKv) != 0};
      for (const std::string& arch : detail::known_archs())
        if (family->runs_on(arch)) info.archs.push_back(arch);
      list.push_back(std::move(info));
    }
    return list;
  }();
  return infos;
}

std::vector<int> supported_head_dims() { return detail::head_dims_of_all_families(); }

}  // namespace flashjit

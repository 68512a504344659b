#include "jit/user_source.hpp"

#include <fmt/format.h>

#include "core/user_functions.hpp"

namespace flashjit::detail {

std::string user_functions_source(std::string_view score_mod, std::string_view mask_mod,
                                  std::string_view score_mod_grad) {
  // The caller's code sits in a namespace of its own (its helpers cannot collide with ours) that
  // sees flashjit::UserArgs; the wrappers keep the kernels' names and the default functions'
  // behaviour for one that is absent (kScoreModGrad false: the backward kernels refuse to build).
  std::string text =
      "#pragma once\n#include \"common/params.cuh\"\nnamespace flashjit::user_code {\n";
  for (auto [role, code] : {std::pair{"score_mod", score_mod}, std::pair{"mask_mod", mask_mod},
                            std::pair{"score_mod_grad", score_mod_grad}})
    if (!code.empty()) text += fmt::format("#line 1 \"{}\"\n{}\n", role, code);
  constexpr const char* kCallScore = "(score, batch, head, q_idx, kv_idx, args)";
  text += fmt::format(
      "}}\n#line 1 \"flashjit/user_functions\"\n"
      "namespace flashjit::user {{\n"
      "constexpr bool kScoreMod = {0};\n"
      "constexpr bool kMaskMod = {1};\n"
      "constexpr bool kScoreModGrad = {2};\n"
      "__device__ __forceinline__ float score_mod(float score, int batch, int head, int q_idx,\n"
      "                                           int kv_idx, const UserArgs& args) {{\n"
      "  return {3};\n}}\n"
      "__device__ __forceinline__ bool mask_mod(int batch, int head, int q_idx, int kv_idx,\n"
      "                                         const UserArgs& args) {{\n"
      "  return {4};\n}}\n"
      "__device__ __forceinline__ float score_mod_grad(float score, int batch, int head,\n"
      "                                                int q_idx, int kv_idx,\n"
      "                                                const UserArgs& args) {{\n"
      "  return {5};\n}}\n"
      "}}  // namespace flashjit::user\n",
      !score_mod.empty(), !mask_mod.empty(), !score_mod_grad.empty(),
      !score_mod.empty() ? fmt::format("static_cast<float>(user_code::score_mod{})", kCallScore)
                         : "score",
      !mask_mod.empty()
          ? "static_cast<bool>(user_code::mask_mod(batch, head, q_idx, kv_idx, args))"
          : "true",
      !score_mod_grad.empty()
          ? fmt::format("static_cast<float>(user_code::score_mod_grad{})", kCallScore)
          : "1.f");
  return text;
}

std::vector<SourceFile> with_user_functions(std::vector<SourceFile> unit, const Variant& variant) {
  if (variant.user_functions.empty()) return unit;
  const auto functions = registered_user_functions(variant.user_functions);
  if (!functions)
    throw Error(ErrorCode::compile_failed,
                fmt::format("variant {} has user functions of hash {} that this process does not "
                            "know: make a flashjit::UserFunctions of their source first (CLI: "
                            "precompile --score-mod / --mask-mod FILE)",
                            variant.name(), variant.user_functions));
  for (SourceFile& file : unit)
    if (file.path == kUserFunctionsFile)
      file.text = user_functions_source(functions->score_mod(), functions->mask_mod(),
                                        functions->score_mod_grad());
  return unit;
}

bool has_mask_mod(const Variant& variant) {
  if (variant.user_functions.empty()) return false;
  const auto functions = registered_user_functions(variant.user_functions);
  return functions && !functions->mask_mod().empty();
}

SourceFile user_functions_template() {
  return {"(user functions template)", user_functions_source("score_mod", "mask_mod", "score_mod_grad")};
}

}  // namespace flashjit::detail

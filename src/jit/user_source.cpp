#include "jit/user_source.hpp"

#include <fmt/format.h>

#include "core/user_functions.hpp"

namespace flashjit::detail {

std::string user_functions_source(std::string_view score_mod, std::string_view mask_mod) {
  // The caller's code sits in a namespace of its own (its helpers cannot collide with ours) that
  // sees flashjit::UserArgs; the wrappers keep the kernels' names and the default functions'
  // behaviour for the one that is absent.
  std::string text =
      "#pragma once\n#include \"common/params.cuh\"\nnamespace flashjit::user_code {\n";
  if (!score_mod.empty())
    text += fmt::format("#line 1 \"score_mod\"\n{}\n", score_mod);
  if (!mask_mod.empty())
    text += fmt::format("#line 1 \"mask_mod\"\n{}\n", mask_mod);
  text += fmt::format(
      "}}\n#line 1 \"flashjit/user_functions\"\n"
      "namespace flashjit::user {{\n"
      "constexpr bool kScoreMod = {0};\n"
      "constexpr bool kMaskMod = {1};\n"
      "__device__ __forceinline__ float score_mod(float score, int batch, int head, int q_idx,\n"
      "                                           int kv_idx, const UserArgs& args) {{\n"
      "  return {2};\n}}\n"
      "__device__ __forceinline__ bool mask_mod(int batch, int head, int q_idx, int kv_idx,\n"
      "                                         const UserArgs& args) {{\n"
      "  return {3};\n}}\n"
      "}}  // namespace flashjit::user\n",
      !score_mod.empty(), !mask_mod.empty(),
      !score_mod.empty()
          ? "static_cast<float>(user_code::score_mod(score, batch, head, q_idx, kv_idx, args))"
          : "score",
      !mask_mod.empty()
          ? "static_cast<bool>(user_code::mask_mod(batch, head, q_idx, kv_idx, args))"
          : "true");
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
      file.text = user_functions_source(functions->score_mod(), functions->mask_mod());
  return unit;
}

SourceFile user_functions_template() {
  return {"(user functions template)", user_functions_source("score_mod", "mask_mod")};
}

}  // namespace flashjit::detail

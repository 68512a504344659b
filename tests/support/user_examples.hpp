// The user-function examples of examples/user_functions, as a caller loads them (from their
// files), and host mirrors of what each computes for the float64 reference (ScoreMods). The CPU
// tests compile them; the GPU tests run them.
#pragma once

#include <algorithm>
#include <cstdint>
#include <filesystem>
#include <fstream>
#include <random>
#include <regex>
#include <sstream>
#include <stdexcept>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "flashjit/flashjit.hpp"
#include "reference.hpp"

namespace flashjit::test {

// Where CMake saw the examples, else examples/user_functions below the working directory: a GPU
// machine runs the packed tests from the root of a copy of the repository, at another path.
inline std::filesystem::path user_example(std::string_view file) {
  const std::filesystem::path built = FLASHJIT_USER_EXAMPLES_DIR;
  return (std::filesystem::is_directory(built) ? built : "examples/user_functions") / file;
}

// mask_mod: args.ptr[0] = int32 doc_id[seqlen]; a key is seen by the queries of its document.
inline UserFunctions document_mask_functions() {
  return UserFunctions::from_files({}, user_example("document_mask.cu"));
}
// score_mod: args.ptr[0] = fp32 table[heads_q * (2 R + 1)], R = relative_position_range(); with
// its derivative for the backward.
inline UserFunctions relative_position_bias_functions() {
  return UserFunctions::from_files(user_example("relative_position_bias.cu"), {},
                                   user_example("relative_position_bias_grad.cu"));
}
// mask_mod: args.ptr[0] = int32 prefix[batch]; the prefix is seen by all, the rest causally.
inline UserFunctions prefix_lm_functions() {
  return UserFunctions::from_files({}, user_example("prefix_lm.cu"));
}

// R of relative_position_bias.cu, read from the file (its `constexpr int kMaxDistance = R;`), so
// the host mirror cannot drift from it.
inline int relative_position_range() {
  std::ifstream in(user_example("relative_position_bias.cu"));
  std::stringstream text;
  text << in.rdbuf();
  const std::string source = text.str();
  std::smatch match;
  if (!std::regex_search(source, match, std::regex(R"(constexpr int kMaxDistance = (\d+);)")))
    throw std::runtime_error("relative_position_bias.cu declares no `constexpr int kMaxDistance`");
  return std::stoi(match[1]);
}

// document_mask.cu's doc_id: documents of 1 to max_length tokens packed one after another over
// `length` positions.
inline std::vector<std::int32_t> random_documents(int length, int max_length, std::mt19937& rng) {
  std::vector<std::int32_t> doc_id;
  for (std::int32_t id = 0; static_cast<int>(doc_id.size()) < length; ++id)
    doc_id.insert(doc_id.end(), 1 + rng() % max_length, id);
  doc_id.resize(static_cast<std::size_t>(length));
  return doc_id;
}

// Host mirrors of the examples over the host copies of what their args.ptr[0] points to.
inline HostMaskMod document_mask(std::vector<std::int32_t> doc_id) {
  return [doc_id = std::move(doc_id)](int, int, int q_idx, int kv_idx) {
    return doc_id.at(static_cast<std::size_t>(q_idx)) ==
           doc_id.at(static_cast<std::size_t>(kv_idx));
  };
}
inline HostScoreMod relative_position_bias(std::vector<float> table) {
  const int range = relative_position_range();
  return [table = std::move(table), range](double score, int, int head, int q_idx, int kv_idx) {
    const int distance = std::clamp(kv_idx - q_idx, -range, range);
    return score + table.at(static_cast<std::size_t>(head * (2 * range + 1) + range + distance));
  };
}
// d relative_position_bias / d score.
inline double relative_position_bias_grad(double, int, int, int, int) { return 1.0; }
inline HostMaskMod prefix_lm(std::vector<std::int32_t> prefix) {
  return [prefix = std::move(prefix)](int batch, int, int q_idx, int kv_idx) {
    return kv_idx < prefix.at(static_cast<std::size_t>(batch)) || kv_idx <= q_idx;
  };
}

}  // namespace flashjit::test

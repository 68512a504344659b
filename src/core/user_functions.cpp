#include "core/user_functions.hpp"

#include <fmt/format.h>
#include <xxhash.h>

#include <charconv>
#include <fstream>
#include <mutex>
#include <sstream>
#include <string>
#include <unordered_map>

namespace flashjit {
namespace {

constexpr std::size_t kHashDigits = 32;

struct Registry {
  std::mutex mutex;
  std::unordered_map<std::string, UserFunctions> by_hash;
};
Registry& registry() {
  static Registry instance;
  return instance;
}

std::string hash_sources(std::string_view score_mod, std::string_view mask_mod,
                         std::string_view score_mod_grad) {
  XXH3_state_t* state = XXH3_createState();
  XXH3_128bits_reset(state);
  // Each source with its role and length: moving text from one function to another, or across
  // their boundary, changes the hash. An absent score_mod_grad adds nothing (the hashes of
  // functions without one are those they had before it existed, and their cache entries stay).
  for (auto [role, text] : {std::pair{std::string_view("score_mod"), score_mod},
                            std::pair{std::string_view("mask_mod"), mask_mod},
                            std::pair{std::string_view("score_mod_grad"), score_mod_grad}}) {
    if (role == "score_mod_grad" && text.empty()) continue;
    const std::string header = fmt::format("{}:{}:", role, text.size());
    XXH3_128bits_update(state, header.data(), header.size());
    XXH3_128bits_update(state, text.data(), text.size());
  }
  const XXH128_hash_t hash = XXH3_128bits_digest(state);
  XXH3_freeState(state);
  return fmt::format("{:016x}{:016x}", hash.high64, hash.low64);
}

std::string read_source(const std::filesystem::path& file, std::string_view role) {
  if (file.empty()) return {};
  std::ifstream in(file, std::ios::binary);
  std::ostringstream text;
  if (in) text << in.rdbuf();
  if (!in || in.bad())
    throw Error(ErrorCode::invalid_argument,
                fmt::format("{} file {} cannot be read: expected a readable CUDA C source file",
                            role, file.string()));
  if (text.str().empty())
    throw Error(ErrorCode::invalid_argument,
                fmt::format("{} file {} is empty: expected the source of {}", role, file.string(),
                            role));
  return text.str();
}

}  // namespace

UserFunctions::UserFunctions(std::string score_mod, std::string mask_mod,
                             std::string score_mod_grad)
    : score_mod_(std::move(score_mod)),
      mask_mod_(std::move(mask_mod)),
      score_mod_grad_(std::move(score_mod_grad)) {
  if (score_mod_.empty() && mask_mod_.empty())
    throw Error(ErrorCode::invalid_argument,
                "UserFunctions: score_mod and mask_mod are both empty: expected the CUDA C source "
                "of at least one of them");
  if (!score_mod_grad_.empty() && score_mod_.empty())
    throw Error(ErrorCode::invalid_argument,
                "UserFunctions: score_mod_grad is given without a score_mod: expected the "
                "score_mod whose derivative it is, or no score_mod_grad");
  hash_ = hash_sources(score_mod_, mask_mod_, score_mod_grad_);
  Registry& r = registry();
  std::lock_guard lock(r.mutex);
  r.by_hash.try_emplace(hash_, *this);
}

UserFunctions UserFunctions::from_files(const std::filesystem::path& score_mod_file,
                                        const std::filesystem::path& mask_mod_file,
                                        const std::filesystem::path& score_mod_grad_file) {
  return UserFunctions(read_source(score_mod_file, "score_mod"),
                       read_source(mask_mod_file, "mask_mod"),
                       read_source(score_mod_grad_file, "score_mod_grad"));
}

}  // namespace flashjit

namespace flashjit::detail {

std::optional<UserFunctions> registered_user_functions(std::string_view hash) {
  Registry& r = registry();
  std::lock_guard lock(r.mutex);
  auto it = r.by_hash.find(std::string(hash));
  if (it == r.by_hash.end()) return std::nullopt;
  return it->second;
}

std::string check_user_functions_hash(std::string_view hash) {
  if (hash.size() != kHashDigits)
    return fmt::format("'{}' has {} characters: expected {} lowercase hex digits", hash,
                       hash.size(), kHashDigits);
  for (char c : hash)
    if (!((c >= '0' && c <= '9') || (c >= 'a' && c <= 'f')))
      return fmt::format("'{}' is not {} lowercase hex digits", hash, kHashDigits);
  return {};
}

std::array<std::uint64_t, 2> user_functions_key(std::string_view hash) {
  std::array<std::uint64_t, 2> key{};
  if (hash.size() != kHashDigits) return key;
  for (int half = 0; half < 2; ++half)
    std::from_chars(hash.data() + 16 * half, hash.data() + 16 * half + 16, key[half], 16);
  return key;
}

}  // namespace flashjit::detail

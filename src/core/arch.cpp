#include "core/arch.hpp"

#include <fmt/format.h>
#include <fmt/ranges.h>

#include <algorithm>
#include <cctype>
#include <map>

#include "flashjit/flashjit.hpp"

namespace flashjit::detail {

const std::vector<std::string>& known_archs() {
  static const std::vector<std::string> archs = {"sm_80",  "sm_86",  "sm_87",   "sm_89",  "sm_90",
                                                 "sm_90a", "sm_100", "sm_100a", "sm_103", "sm_103a",
                                                 "sm_110", "sm_120", "sm_120a", "sm_121"};
  return archs;
}

std::string arch_for_compute_capability(int major, int minor) {
  const int number = major * 10 + minor;
  if (number == 90 || number == 100 || number == 103) return fmt::format("sm_{}a", number);
  return fmt::format("sm_{}", number);
}

int arch_number(std::string_view arch) {
  if (arch.substr(0, 3) != "sm_") return 0;
  int number = 0;
  for (char c : arch.substr(3)) {
    if (!std::isdigit(static_cast<unsigned char>(c))) break;
    number = number * 10 + (c - '0');
  }
  return number;
}

int max_shared_bytes_per_block(std::string_view arch) {
  const int number = arch_number(arch);
  if (number == 80 || number == 87) return 163 * 1024;
  if (number >= 90 && number < 120) return 227 * 1024;
  return 99 * 1024;  // sm_86, sm_89, sm_120, sm_121
}

bool arch_has_accelerated_features(std::string_view arch) {
  return !arch.empty() && arch.back() == 'a';
}

}  // namespace flashjit::detail

namespace flashjit {

std::string normalize_arch(std::string_view input) {
  std::string text;
  for (char c : input) text += static_cast<char>(std::tolower(static_cast<unsigned char>(c)));
  static const std::map<std::string, std::string> product_names = {
      {"a100", "sm_80"},    {"a800", "sm_80"},   {"a30", "sm_80"},     {"ampere", "sm_80"},
      {"a10", "sm_86"},     {"a40", "sm_86"},    {"rtx3090", "sm_86"}, {"l4", "sm_89"},
      {"l40", "sm_89"},     {"l40s", "sm_89"},   {"rtx4090", "sm_89"}, {"ada", "sm_89"},
      {"h100", "sm_90a"},   {"h200", "sm_90a"},  {"h800", "sm_90a"},   {"gh200", "sm_90a"},
      {"hopper", "sm_90a"}, {"b200", "sm_100a"}, {"gb200", "sm_100a"}, {"blackwell", "sm_100a"},
      {"rtx5090", "sm_120"}};
  if (auto it = product_names.find(text); it != product_names.end()) return it->second;

  std::string canonical;
  if (text.rfind("sm_", 0) == 0) {
    canonical = text;
  } else if (text.rfind("sm", 0) == 0) {
    canonical = "sm_" + text.substr(2);
  } else {
    // "90" or "9.0": the target flashjit uses for that compute capability.
    std::string digits = text;
    std::erase(digits, '.');
    if (!digits.empty() && digits.size() <= 3 &&
        std::all_of(digits.begin(), digits.end(), [](char c) { return std::isdigit(c); })) {
      int number = std::stoi(digits);
      canonical = detail::arch_for_compute_capability(number / 10, number % 10);
    }
  }
  const auto& known = detail::known_archs();
  if (std::find(known.begin(), known.end(), canonical) != known.end()) return canonical;
  throw Error(ErrorCode::invalid_argument,
              fmt::format("unknown arch '{}': expected one of {}, a compute capability such as "
                          "90 or 8.6, or a GPU name ({})",
                          input, fmt::join(known, ", "),
                          "a100, a10, l4, l40s, h100, h200, b200, rtx4090, rtx5090"));
}

}  // namespace flashjit

#include "core/variant_name.hpp"

#include <fmt/format.h>

#include <algorithm>
#include <charconv>
#include <iterator>
#include <string>
#include <vector>

#include "core/arch.hpp"
#include "core/user_functions.hpp"

namespace flashjit {

std::string_view to_string(DType dtype) { return dtype == DType::bf16 ? "bf16" : "fp16"; }

std::string Variant::name() const {
  std::string arch_part = arch;
  std::erase(arch_part, '_');  // sm_90a -> sm90a keeps the name one token per field
  return fmt::format("{}.{}.{}.d{}.m{}n{}s{}{}{}{}{}{}{}{}{}{}", family, arch_part,
                     to_string(dtype), head_dim, tile_m, tile_n, stages, causal ? ".causal" : "",
                     paged ? ".paged" : "", varlen ? ".varlen" : "", softcap ? ".softcap" : "",
                     window ? ".window" : "", sink ? ".sink" : "", alibi ? ".alibi" : "",
                     user_functions.empty() ? "" : ".user", user_functions);
}

}  // namespace flashjit

namespace flashjit::detail {
namespace {

// The optional suffixes after the tiles, in name order; the user functions' (".user<hash>") last.
constexpr std::string_view kFeatureSuffixes[] = {"causal", "paged", "varlen", "softcap",
                                                 "window", "sink",  "alibi"};
constexpr std::string_view kUserSuffix = "user";

std::vector<std::string_view> split(std::string_view text, char sep) {
  std::vector<std::string_view> parts;
  size_t start = 0;
  while (true) {
    size_t end = text.find(sep, start);
    parts.push_back(text.substr(start, end - start));
    if (end == std::string_view::npos) return parts;
    start = end + 1;
  }
}

// Reads a positive decimal at the front of `text`, advancing it; nullopt if none.
std::optional<int> take_number(std::string_view& text) {
  int value = 0;
  auto [end, error] = std::from_chars(text.data(), text.data() + text.size(), value);
  if (error != std::errc() || end == text.data() || value <= 0) return std::nullopt;
  text.remove_prefix(static_cast<size_t>(end - text.data()));
  return value;
}

[[noreturn]] void bad_field(std::string_view name, std::string_view field, std::string_view what) {
  throw Error(ErrorCode::invalid_argument,
              fmt::format("bad variant name '{}': {} field: {}", name, field, what));
}

// A family name is one lowercase token, so it can never swallow the next field.
bool is_family_token(std::string_view text) {
  return !text.empty() && std::all_of(text.begin(), text.end(), [](char c) {
    return (c >= 'a' && c <= 'z') || (c >= '0' && c <= '9') || c == '_';
  });
}

}  // namespace

Variant parse_variant_name(std::string_view name) {
  const auto parts = split(name, '.');
  if (parts.size() < 5 || parts.size() > 6 + std::size(kFeatureSuffixes))
    throw Error(
        ErrorCode::invalid_argument,
        fmt::format(
            "bad variant name '{}': expected "
            "<family>.<arch>.<dtype>.d<head_dim>.m<M>n<N>s<stages>[.causal][.paged][.varlen]"
            "[.softcap][.window][.sink][.alibi][.user<hash>], e.g. "
            "mma.sm90a.bf16.d128.m128n64s2.causal",
            name));
  Variant v;
  if (!is_family_token(parts[0]))
    bad_field(name, "family",
              fmt::format("'{}' is not a family name (lowercase letters, digits)", parts[0]));
  v.family = std::string(parts[0]);

  std::string_view arch = parts[1];
  if (arch.substr(0, 2) != "sm") bad_field(name, "arch", "expected sm<NN>[a], e.g. sm90a");
  const std::string canonical = "sm_" + std::string(arch.substr(2));
  const auto& known = known_archs();
  if (std::find(known.begin(), known.end(), canonical) == known.end())
    bad_field(name, "arch", fmt::format("'{}' is not a known arch", arch));
  v.arch = canonical;

  if (parts[2] == "bf16")
    v.dtype = DType::bf16;
  else if (parts[2] == "fp16")
    v.dtype = DType::fp16;
  else
    bad_field(name, "dtype", fmt::format("'{}' is not bf16 or fp16", parts[2]));

  std::string_view dim = parts[3];
  if (dim.empty() || dim[0] != 'd') bad_field(name, "head_dim", "expected d<N>, e.g. d128");
  dim.remove_prefix(1);
  auto head_dim = take_number(dim);
  if (!head_dim || !dim.empty()) bad_field(name, "head_dim", "expected d<N>, e.g. d128");
  v.head_dim = *head_dim;

  std::string_view tiles = parts[4];
  auto expect = [&](char c) {
    if (tiles.empty() || tiles[0] != c)
      bad_field(name, "tiles", "expected m<tile_m>n<tile_n>s<stages>, e.g. m128n64s2");
    tiles.remove_prefix(1);
  };
  expect('m');
  auto tile_m = take_number(tiles);
  expect('n');
  auto tile_n = take_number(tiles);
  expect('s');
  auto stages = take_number(tiles);
  if (!tile_m || !tile_n || !stages || !tiles.empty())
    bad_field(name, "tiles", "expected m<tile_m>n<tile_n>s<stages>, e.g. m128n64s2");
  v.tile_m = *tile_m;
  v.tile_n = *tile_n;
  v.stages = *stages;

  // Feature suffixes, each at most once and in kFeatureSuffixes' order, so a variant has one name.
  std::size_t next_suffix = 0;
  std::size_t features_end = parts.size();
  if (parts.size() > 5 && parts.back().substr(0, kUserSuffix.size()) == kUserSuffix &&
      parts.back() != kUserSuffix) {
    const std::string_view hash = parts.back().substr(kUserSuffix.size());
    if (std::string why = check_user_functions_hash(hash); !why.empty())
      bad_field(name, "user functions", why);
    v.user_functions = std::string(hash);
    --features_end;
  }
  for (std::size_t i = 5; i < features_end; ++i) {
    while (next_suffix < std::size(kFeatureSuffixes) && kFeatureSuffixes[next_suffix] != parts[i])
      ++next_suffix;
    if (next_suffix == std::size(kFeatureSuffixes))
      bad_field(name, "features",
                fmt::format("'{}' is not one of causal, paged, varlen, softcap, window, sink, "
                            "alibi, user<hash> (in that order, each once)",
                            parts[i]));
    if (next_suffix == 0) v.causal = true;
    if (next_suffix == 1) v.paged = true;
    if (next_suffix == 2) v.varlen = true;
    if (next_suffix == 3) v.softcap = true;
    if (next_suffix == 4) v.window = true;
    if (next_suffix == 5) v.sink = true;
    if (next_suffix == 6) v.alibi = true;
    ++next_suffix;
  }
  return v;
}

}  // namespace flashjit::detail

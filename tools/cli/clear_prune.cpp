// `flashjit clear` and `flashjit prune`: remove cached kernels, all of an arch or the least
// recently used beyond a size limit.
#include <fmt/format.h>

#include <algorithm>
#include <cctype>
#include <charconv>
#include <iterator>

#include "cli.hpp"
#include "options.hpp"
#include "table.hpp"

namespace flashjit::cli {
namespace {

std::uint64_t total_bytes(const std::vector<CacheEntry>& entries) {
  std::uint64_t bytes = 0;
  for (const CacheEntry& e : entries) bytes += e.cubin_bytes;
  return bytes;
}

int run_clear(const std::string& arch, const GlobalOptions& globals) {
  const auto cache = open_cache(globals, /*need_disk=*/true);
  const std::optional<std::string> which = arch.empty() ? std::nullopt : std::optional(arch);
  const std::uint64_t before = total_bytes(cache->list(which));
  const std::size_t removed = cache->clear(which);
  const std::uint64_t after = total_bytes(cache->list(which));
  if (!globals.quiet)
    fmt::print("removed {} entries{} ({}) from {}\n", removed,
               which ? fmt::format(" for {}", *which) : "", human_bytes(before - after),
               describe_cache_location(*cache));
  return 0;
}

int run_prune(std::optional<std::uint64_t> max_bytes, bool stale, const GlobalOptions& globals) {
  const auto cache = open_cache(globals, /*need_disk=*/true);
  const std::uint64_t before = total_bytes(cache->list());
  if (stale) {
    const std::size_t removed = cache->remove_stale();
    if (!globals.quiet)
      fmt::print("removed {} stale entries (built from other sources, options or versions)\n",
                 removed);
    if (!max_bytes) return 0;
  }
  const std::size_t removed = cache->prune(*max_bytes);
  const auto remaining = cache->list();
  const std::uint64_t after = total_bytes(remaining);
  if (!globals.quiet)
    fmt::print(
        "removed {} entries ({}), least recently used first; {} entries ({}) remain, "
        "limit {} bytes, in {}\n",
        removed, human_bytes(before - after), remaining.size(), human_bytes(after), *max_bytes,
        describe_cache_location(*cache));
  return 0;
}

}  // namespace

// "500k" -> "500000": a non-negative count of bytes with an optional unit, rewritten to the plain
// number; a negative size, an unknown unit or one that overflows 64 bits is refused by name.
CLI::Validator size_validator() {
  return CLI::Validator(
      [](std::string& value) -> std::string {
        static const std::pair<const char*, std::uint64_t> kUnits[] = {{"", 1},
                                                                       {"b", 1},
                                                                       {"k", 1000},
                                                                       {"kb", 1000},
                                                                       {"m", 1000000},
                                                                       {"mb", 1000000},
                                                                       {"g", 1000000000},
                                                                       {"gb", 1000000000},
                                                                       {"t", 1000000000000},
                                                                       {"tb", 1000000000000},
                                                                       {"kib", 1ull << 10},
                                                                       {"mib", 1ull << 20},
                                                                       {"gib", 1ull << 30},
                                                                       {"tib", 1ull << 40}};
        std::size_t digits = 0;
        while (digits < value.size() && std::isdigit(static_cast<unsigned char>(value[digits])))
          ++digits;
        if (digits == 0)
          return fmt::format(
              "'{}' is not a size: expected a non-negative number of bytes, "
              "optionally with a unit (500k, 20M, 1G, 512KiB, 1GiB)",
              value);
        std::string unit = value.substr(digits);
        for (char& c : unit) c = static_cast<char>(std::tolower(static_cast<unsigned char>(c)));
        const auto found = std::find_if(std::begin(kUnits), std::end(kUnits),
                                        [&](const auto& u) { return unit == u.first; });
        if (found == std::end(kUnits))
          return fmt::format(
              "'{}' has an unknown unit '{}': expected k, M, G, T (powers of 1000) "
              "or KiB, MiB, GiB, TiB",
              value, value.substr(digits));
        std::uint64_t number = 0, bytes = 0;
        const auto [end, error] = std::from_chars(value.data(), value.data() + digits, number);
        if (error != std::errc() || end != value.data() + digits ||
            __builtin_mul_overflow(number, found->second, &bytes))
          return fmt::format("'{}' is more bytes than 64 bits can count", value);
        value = std::to_string(bytes);
        return {};
      },
      "");
}

void add_clear_command(CLI::App& app, const GlobalOptions& globals, int& status) {
  auto arch = std::make_shared<std::string>();
  CLI::App* command = app.add_subcommand("clear", "Remove cached kernels (all, or one arch's)");
  add_arch_option(*command, *arch, "Only this arch's entries");
  command->callback([&globals, &status, arch] { status = run_clear(*arch, globals); });
}

void add_prune_command(CLI::App& app, const GlobalOptions& globals, int& status) {
  auto max_bytes = std::make_shared<std::optional<std::uint64_t>>();
  auto stale = std::make_shared<bool>(false);
  CLI::App* command = app.add_subcommand(
      "prune",
      "Remove stale kernels, and/or the least recently used ones until the cache fits a size");
  command->add_flag("--stale", *stale,
                    "Remove entries built from other kernel sources, options or versions (never "
                    "served; `list` marks them stale)");
  command
      ->add_option("--max-size", *max_bytes,
                   "Size to fit in: bytes, or with a unit: 500k, 20M, 1G (powers of 1000), "
                   "512KiB, 1GiB (powers of 1024)")
      ->transform(size_validator())
      ->type_name("SIZE");
  command->require_option(1, 2);  // --stale, --max-size, or both
  command->callback([&globals, &status, max_bytes, stale] {
    status = run_prune(*max_bytes, *stale, globals);
  });
}

}  // namespace flashjit::cli

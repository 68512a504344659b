// `flashjit clear` and `flashjit prune`: remove cached kernels, all of an arch or the least
// recently used beyond a size limit.
#include <fmt/format.h>

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
      ->transform(CLI::AsSizeValue(/*kb_is_1000=*/true).description(""))
      ->type_name("SIZE");
  command->require_option(1, 2);  // --stale, --max-size, or both
  command->callback([&globals, &status, max_bytes, stale] {
    status = run_prune(*max_bytes, *stale, globals);
  });
}

}  // namespace flashjit::cli

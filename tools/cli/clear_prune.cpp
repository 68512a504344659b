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

int run_prune(std::uint64_t max_bytes, const GlobalOptions& globals) {
  const auto cache = open_cache(globals, /*need_disk=*/true);
  const std::uint64_t before = total_bytes(cache->list());
  const std::size_t removed = cache->prune(max_bytes);
  const auto remaining = cache->list();
  const std::uint64_t after = total_bytes(remaining);
  if (!globals.quiet)
    fmt::print(
        "removed {} entries ({}), least recently used first; {} entries ({}) remain, "
        "limit {} bytes, in {}\n",
        removed, human_bytes(before - after), remaining.size(), human_bytes(after), max_bytes,
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
  auto max_bytes = std::make_shared<std::uint64_t>(0);
  CLI::App* command = app.add_subcommand(
      "prune", "Remove the least recently used kernels until the cache fits a size");
  command
      ->add_option("--max-size", *max_bytes,
                   "Size to fit in: bytes, or with a unit: 500k, 20M, 1G (powers of 1000), "
                   "512KiB, 1GiB (powers of 1024)")
      ->required()
      ->transform(CLI::AsSizeValue(/*kb_is_1000=*/true).description(""))
      ->type_name("SIZE");
  command->callback([&globals, &status, max_bytes] { status = run_prune(*max_bytes, globals); });
}

}  // namespace flashjit::cli

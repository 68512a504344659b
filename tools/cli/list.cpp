// `flashjit list`: the cached kernels, as a table or as JSON for scripts.
#include <fmt/format.h>

#include <algorithm>
#include <nlohmann/json.hpp>
#include <tuple>

#include "cli.hpp"
#include "options.hpp"
#include "table.hpp"

namespace flashjit::cli {
namespace {

struct ListOptions {
  std::string arch;  // empty: every arch
  std::vector<std::string> families;
  bool json = false;
};

int shared_bytes(const CacheEntry& entry) {
  return entry.static_shared_bytes + entry.dynamic_shared_bytes;
}

nlohmann::ordered_json entry_json(const CacheEntry& entry) {
  const Variant& v = entry.variant;
  return {{"name", v.name()},
          {"family", v.family},
          {"arch", v.arch},
          {"dtype", to_string(v.dtype)},
          {"head_dim", v.head_dim},
          {"causal", v.causal},
          {"softcap", v.softcap},
          {"window", v.window},
          {"sink", v.sink},
          {"alibi", v.alibi},
          {"user_functions", v.user_functions},  // the hash, "" for none
          {"tile_m", v.tile_m},
          {"tile_n", v.tile_n},
          {"stages", v.stages},
          {"registers", entry.registers},
          {"spill_bytes", entry.spill_bytes},
          {"shared_mem_bytes", shared_bytes(entry)},
          {"static_shared_bytes", entry.static_shared_bytes},
          {"dynamic_shared_bytes", entry.dynamic_shared_bytes},
          {"cubin_bytes", entry.cubin_bytes},
          {"compile_ms", entry.compile_ms},
          {"nvrtc_version", entry.nvrtc_version},
          {"flashjit_version", entry.flashjit_version},
          {"created", entry.created},
          {"last_used", entry.last_used},
          {"current", entry.state == EntryState::current},
          {"state", to_string(entry.state)},
          {"layer", entry.layer.string()},
          {"read_only", entry.read_only},
          {"key", entry.key},
          {"path", entry.cubin_path.string()}};
}

// Layers are numbered in search order (1: the writable directory when there is one).
std::size_t layer_number(const std::vector<CacheLayer>& layers, const CacheEntry& entry) {
  for (std::size_t i = 0; i < layers.size(); ++i)
    if (layers[i].dir == entry.layer) return i + 1;
  return 0;
}

void print_table(const KernelCache& cache, const std::vector<CacheEntry>& entries) {
  using Align = Table::Align;
  const auto layers = cache.layers();
  Table table({{"NAME"},
               {"REGS", Align::right},
               {"SPILL", Align::right},
               {"SMEM", Align::right},
               {"CUBIN", Align::right},
               {"COMPILE", Align::right},
               {"NVRTC", Align::right},
               {"LAST USED"},
               {"STATE"},
               {"LAYER", Align::right}});
  for (const CacheEntry& e : entries)
    table.add_row(
        {e.variant.name(), fmt::format("{}", e.registers), fmt::format("{} B", e.spill_bytes),
         human_bytes(static_cast<std::uint64_t>(shared_bytes(e))), human_bytes(e.cubin_bytes),
         fmt::format("{:.2f} s", e.compile_ms / 1000), e.nvrtc_version, e.last_used,
         std::string(to_string(e.state)), fmt::format("{}", layer_number(layers, e))});
  table.print();
}

int run_list(const ListOptions& options, const GlobalOptions& globals) {
  const auto cache = open_cache(globals, /*need_disk=*/false);
  std::vector<CacheEntry> entries =
      cache->list(options.arch.empty() ? std::nullopt : std::optional(options.arch));
  if (!options.families.empty())
    std::erase_if(entries, [&](const CacheEntry& e) {
      return std::find(options.families.begin(), options.families.end(), e.variant.family) ==
             options.families.end();
    });
  // By field rather than by name, so head dims read 32, 64, ..., 256 and not 128, 192, ..., 64;
  // families in the library's order (fastest first), unknown ones last.
  auto family_rank = [](const std::string& name) {
    const auto& known = families();
    return std::find_if(known.begin(), known.end(),
                        [&](const FamilyInfo& f) { return f.name == name; }) -
           known.begin();
  };
  std::sort(entries.begin(), entries.end(), [&](const CacheEntry& a, const CacheEntry& b) {
    const Variant& x = a.variant;
    const Variant& y = b.variant;
    return std::tuple(x.arch, family_rank(x.family), x.family, x.dtype, x.head_dim, x.causal,
                      x.tile_m, x.tile_n, x.stages, x.user_functions, a.key) <
           std::tuple(y.arch, family_rank(y.family), y.family, y.dtype, y.head_dim, y.causal,
                      y.tile_m, y.tile_n, y.stages, y.user_functions, b.key);
  });

  if (options.json) {
    nlohmann::ordered_json array = nlohmann::ordered_json::array();
    for (const CacheEntry& entry : entries) array.push_back(entry_json(entry));
    fmt::print("{}\n", array.dump(2, ' ', false, nlohmann::json::error_handler_t::replace));
    return 0;
  }
  const std::string where = describe_cache_location(*cache);
  if (entries.empty()) {
    if (!globals.quiet)
      fmt::print("no cached kernels{} in {}\n",
                 options.arch.empty() ? "" : fmt::format(" for {}", options.arch), where);
    return 0;
  }
  print_table(*cache, entries);
  if (!globals.quiet) {
    std::uint64_t bytes = 0;
    for (const CacheEntry& e : entries) bytes += e.cubin_bytes;
    fmt::print("{} entries, {}, in {}\n", entries.size(), human_bytes(bytes), where);
    const auto layers = cache->layers();
    if (layers.size() > 1)
      for (std::size_t i = 0; i < layers.size(); ++i)
        fmt::print("layer {}: {} ({})\n", i + 1, layers[i].dir.string(),
                   layers[i].writable ? "writable" : "read-only");
  }
  return 0;
}

}  // namespace

void add_list_command(CLI::App& app, const GlobalOptions& globals, int& status) {
  auto options = std::make_shared<ListOptions>();
  CLI::App* command = app.add_subcommand("list", "Show the cached kernels");
  add_arch_option(*command, options->arch, "Only this arch (any spelling --arch takes elsewhere)");
  add_family_option(*command, options->families, "Only these kernel families");
  command->add_flag("--json", options->json,
                    "Print a JSON array, one object per entry (name, family, arch, dtype, "
                    "head_dim, causal and the other features, user_functions (hash), tiles, "
                    "registers, spills, shared memory, sizes, times, state, layer, path)");
  command->callback([&globals, &status, options] { status = run_list(*options, globals); });
}

}  // namespace flashjit::cli

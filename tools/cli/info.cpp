// `flashjit info`: versions, what NVRTC can target, the kernel families (forward and backward),
// the GPUs here, and the cache's size.
#include <fmt/format.h>

#include <algorithm>
#include <fmt/ranges.h>

#include <nlohmann/json.hpp>

#include "cli.hpp"
#include "table.hpp"

namespace flashjit::cli {
namespace {

struct GpuSurvey {
  std::optional<int> driver_version;
  std::vector<DeviceInfo> devices;
  std::string why_none;  // set when `devices` is empty
};

GpuSurvey survey_gpus() {
  GpuSurvey survey;
  try {
    survey.driver_version = flashjit::driver_version();
    survey.devices = flashjit::devices();
    if (survey.devices.empty()) survey.why_none = "the CUDA driver sees no device";
  } catch (const Error& e) {
    survey.why_none = e.what();
  }
  return survey;
}

std::string driver_text(int version) {
  return fmt::format("{}.{}", version / 1000, version % 1000 / 10);
}

void print_text(const GpuSurvey& gpus, const KernelCache& cache,
                const std::vector<CacheEntry>& entries, std::uint64_t bytes) {
  // Labels padded to the longest ("family decode_tma"), at least 13 wide.
  std::size_t width = 13;
  for (const FamilyInfo& family : families())
    width = std::max(width, std::string_view("family ").size() + family.name.size() + 1);
  auto row = [width](std::string_view label, const std::string& value) {
    fmt::print("{:<{}}{}\n", label, width, value);
  };
  row("flashjit", std::string(version()));
  row("NVRTC", nvrtc_version());
  row("NVRTC archs", fmt::format("{}", fmt::join(nvrtc_archs(), " ")));
  for (const FamilyInfo& family : families())
    row(fmt::format("family {}", family.name),
        fmt::format("{}{}; archs {}; head dims {}{}{}{}{}{}{}{}{}{}", family.summary,
                    family.backward ? "; backward pass" : "", fmt::join(family.archs, " "),
                    fmt::join(family.head_dims, " "), family.paged_kv ? "; paged KV" : "",
                    family.varlen ? "; varlen" : "", family.split_kv ? "; split-KV" : "",
                    family.softcap ? "; softcap" : "", family.window ? "; window" : "",
                    family.sink ? "; sink" : "", family.alibi ? "; alibi" : "",
                    family.user_functions ? "; user functions" : "",
                    family.block_mask ? "; block mask" : ""));
  row("CUDA driver", gpus.driver_version ? driver_text(*gpus.driver_version) : "none");
  if (gpus.devices.empty()) row("GPU", fmt::format("no GPU: {}", gpus.why_none));
  for (const DeviceInfo& d : gpus.devices)
    row(fmt::format("GPU {}", d.ordinal),
        fmt::format("{}, compute capability {}.{} (compiles for {}), {} SMs, {} memory, {} "
                    "shared memory per block",
                    d.name, d.cc_major, d.cc_minor, d.arch, d.multiprocessors,
                    human_bytes(d.total_memory), human_bytes(d.max_shared_per_block_optin)));
  row("cache", describe_cache_location(cache));
  row("entries", fmt::format("{} ({})", entries.size(), human_bytes(bytes)));
}

nlohmann::ordered_json to_json(const GpuSurvey& gpus, const KernelCache& cache, std::size_t entries,
                               std::uint64_t bytes) {
  nlohmann::ordered_json devices = nlohmann::ordered_json::array();
  for (const DeviceInfo& d : gpus.devices)
    devices.push_back({{"ordinal", d.ordinal},
                       {"name", d.name},
                       {"compute_capability", fmt::format("{}.{}", d.cc_major, d.cc_minor)},
                       {"arch", d.arch},
                       {"multiprocessors", d.multiprocessors},
                       {"total_memory_bytes", d.total_memory},
                       {"max_shared_per_block_optin", d.max_shared_per_block_optin}});
  nlohmann::ordered_json family_list = nlohmann::ordered_json::array();
  for (const FamilyInfo& family : families())
    family_list.push_back({{"name", family.name},
                           {"attention", family.attention},
                           {"backward", family.backward},
                           {"summary", family.summary},
                           {"archs", family.archs},
                           {"head_dims", family.head_dims},
                           {"softcap", family.softcap},
                           {"window", family.window},
                           {"sink", family.sink},
                           {"alibi", family.alibi},
                           {"user_functions", family.user_functions},
                           {"block_mask", family.block_mask},
                           {"paged_kv", family.paged_kv},
                           {"varlen", family.varlen},
                           {"split_kv", family.split_kv}});
  const auto dir = cache.directory();
  return {{"flashjit_version", version()},
          {"nvrtc_version", nvrtc_version()},
          {"nvrtc_archs", nvrtc_archs()},
          {"families", family_list},
          {"driver_version",
           gpus.driver_version ? nlohmann::ordered_json(*gpus.driver_version) : nullptr},
          {"gpus", devices},
          {"gpu_error", gpus.devices.empty() ? nlohmann::ordered_json(gpus.why_none) : nullptr},
          {"cache",
           {{"dir", dir ? nlohmann::ordered_json(dir->string()) : nullptr},
            {"entries", entries},
            {"bytes", bytes}}}};
}

}  // namespace

void add_info_command(CLI::App& app, const GlobalOptions& globals, int& status) {
  auto json = std::make_shared<bool>(false);
  CLI::App* command = app.add_subcommand(
      "info",
      "Versions, NVRTC targets, kernel families, the GPUs found, and the cache directory and size");
  command->add_flag("--json", *json, "Print one JSON object");
  command->callback([&globals, &status, json] {
    const GpuSurvey gpus = survey_gpus();
    const auto cache = open_cache(globals, false);
    const auto entries = cache->list();
    std::uint64_t bytes = 0;
    for (const CacheEntry& e : entries) bytes += e.cubin_bytes;
    if (*json)
      fmt::print("{}\n", to_json(gpus, *cache, entries.size(), bytes)
                             .dump(2, ' ', false, nlohmann::json::error_handler_t::replace));
    else
      print_text(gpus, *cache, entries, bytes);
    status = 0;
  });
}

}  // namespace flashjit::cli

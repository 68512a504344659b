#include "jit/nvrtc.hpp"

#include <fmt/chrono.h>
#include <fmt/format.h>
#include <nvrtc.h>

#include <algorithm>
#include <chrono>
#include <regex>

#include "core/arch.hpp"
#include "core/log.hpp"

namespace flashjit::detail {
namespace {

void check_nvrtc(nvrtcResult result, const char* call, const std::string& log = {}) {
  if (result != NVRTC_SUCCESS)
    throw Error(ErrorCode::compile_failed,
                fmt::format("{} failed: {}{}{}", call, nvrtcGetErrorString(result),
                            log.empty() ? "" : "\n", log));
}

// The largest over the entries ptxas reports (a kernel and its block-mask entry), summing the
// pattern's groups within each report.
int largest_match(const std::string& log, const std::regex& pattern) {
  int largest = 0;
  for (auto it = std::sregex_iterator(log.begin(), log.end(), pattern);
       it != std::sregex_iterator(); ++it) {
    int total = 0;
    for (std::size_t group = 1; group < it->size(); ++group) total += std::stoi((*it)[group]);
    largest = std::max(largest, total);
  }
  return largest;
}

std::string utc_now() {
  return fmt::format("{:%Y-%m-%dT%H:%M:%SZ}", fmt::gmtime(std::time(nullptr)));
}

}  // namespace

std::vector<std::string> wgmma_serialization_notes(const std::string& log) {
  static const std::regex note(
      R"(\((C\d+)\) Potential Performance Loss: (wgmma[^\n]*?)( (in|for) the function|\n|$))");
  std::vector<std::string> notes;
  for (auto it = std::sregex_iterator(log.begin(), log.end(), note); it != std::sregex_iterator();
       ++it)
    notes.push_back(fmt::format("{}: {}", (*it)[1].str(), (*it)[2].str()));
  return notes;
}

CompiledKernel compile_with_nvrtc(const Variant& variant, const KernelSpec& spec,
                                  const std::vector<SourceFile>& unit) {
  const auto start = std::chrono::steady_clock::now();
  std::vector<const char*> header_texts, header_names;
  for (size_t i = 1; i < unit.size(); ++i) {
    header_texts.push_back(unit[i].text.c_str());
    header_names.push_back(unit[i].path.c_str());
  }
  nvrtcProgram program = nullptr;
  check_nvrtc(nvrtcCreateProgram(&program, unit[0].text.c_str(), unit[0].path.c_str(),
                                 static_cast<int>(header_texts.size()), header_texts.data(),
                                 header_names.data()),
              "nvrtcCreateProgram");
  struct Destroy {
    nvrtcProgram& p;
    ~Destroy() { nvrtcDestroyProgram(&p); }
  } destroy{program};

  const std::string& expression = spec.name_expression;
  const std::string& block_mask_expression = spec.block_mask_name_expression;
  check_nvrtc(nvrtcAddNameExpression(program, expression.c_str()), "nvrtcAddNameExpression");
  if (!block_mask_expression.empty())
    check_nvrtc(nvrtcAddNameExpression(program, block_mask_expression.c_str()),
                "nvrtcAddNameExpression");
  std::vector<const char*> option_ptrs;
  for (const auto& option : spec.options) option_ptrs.push_back(option.c_str());
  const nvrtcResult compiled =
      nvrtcCompileProgram(program, static_cast<int>(option_ptrs.size()), option_ptrs.data());

  CompiledKernel kernel;
  CacheEntry& entry = kernel.entry;
  entry.variant = variant;
  size_t log_size = 0;
  nvrtcGetProgramLogSize(program, &log_size);
  kernel.log.resize(log_size);
  if (log_size > 0) nvrtcGetProgramLog(program, kernel.log.data());
  while (!kernel.log.empty() && (kernel.log.back() == '\0' || kernel.log.back() == '\n'))
    kernel.log.pop_back();
  if (compiled != NVRTC_SUCCESS)
    throw Error(ErrorCode::compile_failed,
                fmt::format("NVRTC could not compile {} ({}):\n{}", variant.name(),
                            nvrtcGetErrorString(compiled), kernel.log));

  const char* lowered = nullptr;
  check_nvrtc(nvrtcGetLoweredName(program, expression.c_str(), &lowered), "nvrtcGetLoweredName");
  kernel.lowered_name = lowered;
  if (!block_mask_expression.empty()) {
    check_nvrtc(nvrtcGetLoweredName(program, block_mask_expression.c_str(), &lowered),
                "nvrtcGetLoweredName");
    kernel.block_mask_lowered_name = lowered;
  }
  size_t cubin_size = 0;
  check_nvrtc(nvrtcGetCUBINSize(program, &cubin_size), "nvrtcGetCUBINSize");
  kernel.cubin.resize(cubin_size);
  check_nvrtc(nvrtcGetCUBIN(program, kernel.cubin.data()), "nvrtcGetCUBIN");

  static const std::regex registers(R"(Used (\d+) registers)");
  static const std::regex spills(R"((\d+) bytes spill stores, (\d+) bytes spill loads)");
  static const std::regex smem(R"((\d+) bytes smem)");
  entry.registers = largest_match(kernel.log, registers);
  entry.spill_bytes = largest_match(kernel.log, spills);
  entry.static_shared_bytes = largest_match(kernel.log, smem);
  entry.dynamic_shared_bytes = spec.dynamic_shared_bytes;
  entry.cubin_bytes = kernel.cubin.size();
  entry.compile_ms =
      std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - start).count();
  entry.created = utc_now();
  entry.nvrtc_version = nvrtc_version();
  entry.flashjit_version = std::string(version());
  kernel.cubin_xxh3 = cubin_hash(kernel.cubin);
  // Spills are reported in the cache metadata and by `flashjit list`; not a warning at run time.
  log().debug("compiled {} in {:.0f} ms: {} registers, {} spill bytes, {} B smem", variant.name(),
              entry.compile_ms, entry.registers, entry.spill_bytes, entry.dynamic_shared_bytes);
  // ptxas's warnings (e.g. wgmma serialized for want of registers) say why a kernel is slow.
  if (kernel.log.find("arning") != std::string::npos)
    log().debug("{}: NVRTC log:\n{}", variant.name(), kernel.log);
  for (const std::string& note : wgmma_serialization_notes(kernel.log))
    log().warn("{}: ptxas serialized its wgmma instructions, so it runs well below its speed "
               "({})", variant.name(), note);
  return kernel;
}

}  // namespace flashjit::detail

namespace flashjit {

std::string nvrtc_version() {
  int major = 0, minor = 0;
  nvrtcVersion(&major, &minor);
  return fmt::format("{}.{}", major, minor);
}

std::vector<std::string> nvrtc_archs() {
  int count = 0;
  nvrtcGetNumSupportedArchs(&count);
  std::vector<int> numbers(static_cast<size_t>(count));
  if (count > 0) nvrtcGetSupportedArchs(numbers.data());
  std::vector<std::string> archs;
  for (const std::string& arch : detail::known_archs())
    if (std::find(numbers.begin(), numbers.end(), detail::arch_number(arch)) != numbers.end())
      archs.push_back(arch);
  return archs;
}

}  // namespace flashjit

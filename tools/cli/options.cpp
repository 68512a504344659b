#include "options.hpp"

#include <fmt/format.h>

#include <algorithm>

namespace flashjit::cli {
namespace {

std::vector<std::string> family_names() {
  std::vector<std::string> names;
  for (const FamilyInfo& family : families()) names.push_back(family.name);
  return names;
}

// Rewrites the value to its canonical arch, or returns normalize_arch's message (which lists
// every valid spelling) for CLI11 to print after the option's name.
CLI::Validator arch_validator() {
  return CLI::Validator(
      [](std::string& value) -> std::string {
        try {
          value = normalize_arch(value);
          return {};
        } catch (const Error& e) {
          return e.what();
        }
      },
      "");
}

}  // namespace

CLI::Option* add_arch_option(CLI::App& command, std::string& arch, const std::string& help) {
  return command.add_option("--arch", arch, help)->transform(arch_validator())->type_name("ARCH");
}

CLI::Option* add_archs_option(CLI::App& command, std::vector<std::string>& archs,
                              const std::string& help) {
  return command.add_option("--arch", archs, help)
      ->delimiter(',')
      ->transform(arch_validator())
      ->type_name("ARCH[,ARCH...]");
}

CLI::Option* add_dtype_option(CLI::App& command, std::vector<std::string>& dtypes,
                              const std::string& help) {
  return command.add_option("--dtype", dtypes, help)
      ->delimiter(',')
      ->check(CLI::IsMember({"bf16", "fp16"}))
      ->type_name("DTYPE");
}

CLI::Option* add_device_option(CLI::App& command, int& device) {
  return command.add_option("--device", device, "GPU ordinal")
      ->check(non_negative())
      ->default_str("0")
      ->type_name("N");
}

CLI::Option* add_head_dim_option(CLI::App& command, std::vector<int>& head_dims) {
  return command.add_option("--head-dim", head_dims, "Head dims (default: every supported one)")
      ->delimiter(',')
      ->check(CLI::IsMember(supported_head_dims()))
      ->type_name("D");
}

CLI::Option* add_family_option(CLI::App& command, std::vector<std::string>& families,
                               const std::string& help) {
  return command.add_option("--family", families, help)
      ->delimiter(',')
      ->check(CLI::IsMember(family_names()))
      ->type_name("FAMILY");
}

namespace {

CLI::Option* add_yes_no_option(CLI::App& command, const std::string& name, std::string& choice,
                               const std::string& help, const std::string& default_choice) {
  return command.add_option(name, choice, help)
      ->check(CLI::IsMember({"yes", "no", "both"}))
      ->default_str(default_choice)
      ->type_name("CHOICE");
}

}  // namespace

CLI::Option* add_causal_option(CLI::App& command, std::string& choice) {
  return add_yes_no_option(command, "--causal", choice, "Causal mask: yes, no or both", "both");
}

CLI::Option* add_softcap_option(CLI::App& command, std::string& choice) {
  return add_yes_no_option(command, "--softcap", choice,
                           "Soft-capped variants (ForwardOptions::softcap): no, yes or both", "no");
}

CLI::Option* add_window_option(CLI::App& command, std::string& choice) {
  return add_yes_no_option(command, "--window", choice,
                           "Sliding-window variants (ForwardOptions::window_left / window_right): "
                           "no, yes or both",
                           "no");
}

CLI::Option* add_sink_option(CLI::App& command, std::string& choice) {
  return add_yes_no_option(command, "--sink", choice,
                           "Attention-sink variants (ForwardOptions::sink_logits): no, yes or both",
                           "no");
}

CLI::Option* add_alibi_option(CLI::App& command, std::string& choice) {
  return add_yes_no_option(command, "--alibi", choice,
                           "ALiBi variants (ForwardOptions::alibi_slopes): no, yes or both", "no");
}

DType dtype_from_name(std::string_view name) { return name == "fp16" ? DType::fp16 : DType::bf16; }

std::vector<bool> yes_no_values(std::string_view choice) {
  if (choice == "yes") return {true};
  if (choice == "no") return {false};
  return {false, true};
}

std::vector<DType> dtypes_or_all(const std::vector<std::string>& names) {
  if (names.empty()) return {DType::bf16, DType::fp16};
  std::vector<DType> dtypes;
  for (const auto& name : names) {
    const DType dtype = dtype_from_name(name);
    if (std::find(dtypes.begin(), dtypes.end(), dtype) == dtypes.end()) dtypes.push_back(dtype);
  }
  return dtypes;
}

std::vector<int> head_dims_or_all(const std::vector<int>& head_dims) {
  if (head_dims.empty()) return supported_head_dims();
  std::vector<int> unique;
  for (int d : head_dims)
    if (std::find(unique.begin(), unique.end(), d) == unique.end()) unique.push_back(d);
  return unique;
}

}  // namespace flashjit::cli

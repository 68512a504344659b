// Option types that several subcommands share: arch, variant name, dtype, head dim, family and
// the causal choice, each validated by CLI11 so a bad value is reported with the option's name.
#pragma once

#include <CLI/CLI.hpp>
#include <limits>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "flashjit/flashjit.hpp"

namespace flashjit::cli {

// Integer bounds with a readable message (CLI11's PositiveNumber names DBL_MAX as its bound);
// their help shows just the option's type name.
inline CLI::Validator positive() {
  return CLI::Range(1, std::numeric_limits<int>::max()).description("");
}
inline CLI::Validator non_negative() {
  return CLI::Range(0, std::numeric_limits<int>::max()).description("");
}

// --arch ARCH: any spelling normalize_arch accepts; the stored value becomes the canonical arch.
CLI::Option* add_arch_option(CLI::App& command, std::string& arch, const std::string& help);
// --arch ARCH[,ARCH...]
CLI::Option* add_archs_option(CLI::App& command, std::vector<std::string>& archs,
                              const std::string& help);
// --dtype bf16,fp16
CLI::Option* add_dtype_option(CLI::App& command, std::vector<std::string>& dtypes,
                              const std::string& help = "Element types (default: both)");
// --head-dim 64,128: supported head dims only.
CLI::Option* add_device_option(CLI::App& command, int& device);
CLI::Option* add_head_dim_option(CLI::App& command, std::vector<int>& head_dims);
// --family NAME[,NAME...]: names from families()
CLI::Option* add_family_option(CLI::App& command, std::vector<std::string>& families,
                               const std::string& help);
// --causal yes|no|both (default both)
CLI::Option* add_causal_option(CLI::App& command, std::string& choice);
// --softcap yes|no|both (default no): soft-capped variants (Variant::softcap)
CLI::Option* add_softcap_option(CLI::App& command, std::string& choice);
// --window yes|no|both (default no): sliding-window variants (Variant::window)
CLI::Option* add_window_option(CLI::App& command, std::string& choice);
// --sink yes|no|both (default no): attention-sink variants (Variant::sink)
CLI::Option* add_sink_option(CLI::App& command, std::string& choice);
// --alibi yes|no|both (default no): ALiBi variants (Variant::alibi)
CLI::Option* add_alibi_option(CLI::App& command, std::string& choice);

// Values already checked by the options above.
DType dtype_from_name(std::string_view name);
// yes -> {true}, no -> {false}, both -> {false, true}
std::vector<bool> yes_no_values(std::string_view choice);

// The values to cover: the user's list, or every value when the list is empty.
std::vector<DType> dtypes_or_all(const std::vector<std::string>& names);
std::vector<int> head_dims_or_all(const std::vector<int>& head_dims);

}  // namespace flashjit::cli

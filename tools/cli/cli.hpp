// What every subcommand shares: the global options, and how each one registers itself.
#pragma once

#include <CLI/CLI.hpp>
#include <filesystem>
#include <memory>
#include <optional>

#include "flashjit/flashjit.hpp"

namespace flashjit::cli {

struct GlobalOptions {
  std::optional<std::filesystem::path> cache_dir;  // unset: the library's default order
  int verbosity = 0;                               // -v count
  bool quiet = false;                              // -q: data and errors only
};

// Maps -v / -q onto the library's log level (FLASHJIT_LOG_LEVEL, which the library reads on
// its first log call); without either flag the user's environment decides.
void apply_log_level(const GlobalOptions& globals);

// Opens the cache the global options name. `need_disk`: fail (Error cache_error) when it fell
// back to memory-only, for commands that are about the disk cache.
std::shared_ptr<KernelCache> open_cache(const GlobalOptions& globals, bool need_disk);
// Where the cache lives, for messages: the directory, or why there is none.
std::string describe_cache_location(const KernelCache& cache);

// The engine on GPU `device` for `command`; without a driver or GPU, an Error that says the
// command needs a GPU and why there is none.
std::unique_ptr<Engine> open_engine(std::string_view command, int device,
                                    std::shared_ptr<KernelCache> cache);

// Each subcommand adds itself to `app`; its callback runs the command and stores its exit
// status in `status`. Errors are thrown as flashjit::Error and reported by main.
void add_info_command(CLI::App& app, const GlobalOptions& globals, int& status);
void add_precompile_command(CLI::App& app, const GlobalOptions& globals, int& status);
void add_list_command(CLI::App& app, const GlobalOptions& globals, int& status);
void add_clear_command(CLI::App& app, const GlobalOptions& globals, int& status);
void add_prune_command(CLI::App& app, const GlobalOptions& globals, int& status);
void add_verify_command(CLI::App& app, const GlobalOptions& globals, int& status);
void add_bench_command(CLI::App& app, const GlobalOptions& globals, int& status);

}  // namespace flashjit::cli

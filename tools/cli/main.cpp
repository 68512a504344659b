// flashjit: precompile kernels for a GPU (also on a build machine without one), inspect and prune
// the kernel cache, and check and time the engine on a GPU.
#include <fmt/format.h>
#include <fmt/ranges.h>

#include <cerrno>
#include <cstdio>
#include <cstring>
#include <system_error>

#include <CLI/CLI.hpp>

#include "cli.hpp"

namespace {

// Usage errors exit 2 like other Unix tools, whatever code CLI11 assigns to the error kind.
constexpr int kUsageError = 2;

}  // namespace

int main(int argc, char** argv) {
  using namespace flashjit::cli;
  CLI::App app{
      "Flash-attention forward kernels, specialized and compiled at run time with NVRTC.\n"
      "Compiled kernels are cached on disk; `precompile` fills the cache ahead of time, also\n"
      "on a machine without a GPU (pass --arch)."};
  app.name("flashjit");
  app.set_version_flag("--version", fmt::format("flashjit {} (NVRTC {})", flashjit::version(),
                                                flashjit::nvrtc_version()));
  GlobalOptions globals;
  app.add_option("--cache-dir", globals.cache_dir,
                 "Kernel cache directory (default: $FLASHJIT_CACHE_DIR, "
                 "$XDG_CACHE_HOME/flashjit, ~/.cache/flashjit)")
      ->type_name("DIR");
  auto* verbose = app.add_flag("-v,--verbose", globals.verbosity,
                               "More output: every item also on a terminal, the library's info "
                               "log; -vv its debug log");
  app.add_flag("-q,--quiet", globals.quiet, "Print only results and errors")->excludes(verbose);
  app.require_subcommand(1);
  // Global options may also follow the subcommand: `flashjit list --cache-dir DIR`.
  app.fallthrough();
  app.parse_complete_callback([&] { apply_log_level(globals); });
  app.failure_message([](const CLI::App*, const CLI::Error& e) {
    return fmt::format("flashjit: error: {}\nRun with --help for more information.\n", e.what());
  });

  int status = 0;
  add_info_command(app, globals, status);
  add_precompile_command(app, globals, status);
  add_list_command(app, globals, status);
  add_clear_command(app, globals, status);
  add_prune_command(app, globals, status);
  add_verify_command(app, globals, status);
  add_bench_command(app, globals, status);

  try {
    app.parse(argc, argv);
  } catch (const CLI::ParseError& e) {
    // Without a subcommand CLI11 would only say that one is required, even when the user typed
    // a wrong one or an unknown option: name what it could not place.
    const auto extras = app.remaining();
    if (app.get_subcommands().empty() && !extras.empty() && extras.front().starts_with('-')) {
      fmt::print(stderr,
                 "flashjit: error: unknown option '{}'\nRun with --help for more information.\n",
                 extras.front());
      return kUsageError;
    }
    if (app.get_subcommands().empty() && !extras.empty()) {
      std::vector<std::string> names;
      for (const CLI::App* command : app.get_subcommands([](CLI::App*) { return true; }))
        names.push_back(command->get_name());
      fmt::print(stderr,
                 "flashjit: error: unknown subcommand '{}': expected one of {}\n"
                 "Run with --help for more information.\n",
                 extras.front(), fmt::join(names, ", "));
      return kUsageError;
    }
    const int code = app.exit(e);
    return code == 0 ? 0 : kUsageError;
  } catch (const flashjit::Error& e) {
    std::fflush(stdout);
    fmt::print(stderr, "flashjit: error: {}\n", e.what());
    return e.code() == flashjit::ErrorCode::invalid_argument ? kUsageError : 1;
  } catch (const std::system_error& e) {
    // fmt's write to stdout failed mid-way (output past one buffer to a full disk, /dev/full):
    // the same error as a failed final flush.
    if (std::ferror(stdout)) {
      fmt::print(stderr, "flashjit: error: cannot write the output: {}\n", e.code().message());
      return 1;
    }
    std::fflush(stdout);
    fmt::print(stderr, "flashjit: error: {}\n", e.what());
    return 1;
  } catch (const std::exception& e) {
    std::fflush(stdout);
    fmt::print(stderr, "flashjit: error: {}\n", e.what());
    return 1;
  }
  // Output that never reached its destination (a full disk, /dev/full, a closed pipe) is a
  // failure, not a success with lost results.
  if (std::fflush(stdout) != 0 || std::ferror(stdout)) {
    fmt::print(stderr, "flashjit: error: cannot write the output: {}\n", std::strerror(errno));
    return 1;
  }
  return status;
}

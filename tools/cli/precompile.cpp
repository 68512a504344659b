// `flashjit precompile`: fills the disk cache for a target GPU, in parallel, so a program's first
// forward call loads a binary instead of compiling. Works without a GPU when --arch is given.
#include <fmt/format.h>
#include <fmt/ranges.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <optional>
#include <thread>

#include "cli.hpp"
#include "options.hpp"
#include "progress.hpp"
#include "table.hpp"

namespace flashjit::cli {
namespace {

struct PrecompileOptions {
  std::vector<std::string> archs;
  std::vector<int> head_dims;
  std::string causal = "both";
  std::string softcap = "no";
  std::string window = "no";
  std::string sink = "no";
  std::string alibi = "no";
  std::vector<std::string> dtypes;
  std::vector<std::string> families;
  std::vector<std::string> variant_names;
  // User functions compiled into every chosen variant (UserFunctions::from_files; empty: none).
  std::string score_mod_file;
  std::string mask_mod_file;
  std::string score_mod_grad_file;
  std::string manifest;  // a variant manifest to build exactly (retargeted to --arch if given)
  std::string out;       // a bundle directory to write (entries + its manifest)
  int jobs = 0;
  bool dry_run = false;
};

constexpr const char* kBundleManifest = "flashjit-manifest.txt";

template <typename Container, typename Value>
bool contains(const Container& container, const Value& value) {
  return std::find(container.begin(), container.end(), value) != container.end();
}

// --variant NAME: rejected by CLI11 with Variant::parse's message, which names the bad field.
CLI::Validator variant_name_validator() {
  return CLI::Validator(
      [](std::string& name) -> std::string {
        try {
          Variant::parse(name);
          return {};
        } catch (const Error& e) {
          return e.what();
        }
      },
      "");
}

const FamilyInfo* family_info(const std::string& family) {
  for (const FamilyInfo& info : families())
    if (info.name == family) return &info;
  return nullptr;
}

// The attention and backward families that compile user functions (the block-mask builder is no
// choice here).
std::string user_function_families() {
  std::vector<std::string> names;
  for (const FamilyInfo& info : families())
    if ((info.attention || info.backward) && info.user_functions) names.push_back(info.name);
  return names.empty() ? "none" : fmt::format("{}", fmt::join(names, ", "));
}

// Where the user functions of a run come from, for messages: "--score-mod a.cu --mask-mod b.cu".
std::string user_function_files(const PrecompileOptions& options) {
  std::string text;
  if (!options.score_mod_file.empty()) text += "--score-mod " + options.score_mod_file;
  if (!options.mask_mod_file.empty())
    text += (text.empty() ? "" : " ") + ("--mask-mod " + options.mask_mod_file);
  if (!options.score_mod_grad_file.empty())
    text += " --score-mod-grad " + options.score_mod_grad_file;
  return text;
}

// Whether the family compiles these user functions: one that has user functions, and for a
// backward family a score_mod's derivative (--score-mod-grad) where there is a score_mod.
bool compiles_user_functions(const FamilyInfo* info, const UserFunctions& functions) {
  return info && info->user_functions && (!info->backward || functions.differentiable());
}

// A named variant (`where`: "--variant NAME" or "--manifest FILE: NAME") with the run's user
// functions: a name with ".user<hash>" needs the sources of that hash; a name without one gets
// them when `add` (the variant's family must compile user functions).
Variant with_user_functions(Variant variant, const UserFunctions* functions,
                            const PrecompileOptions& options, const std::string& where, bool add) {
  if (!variant.user_functions.empty()) {
    if (!functions)
      throw Error(ErrorCode::invalid_argument,
                  fmt::format("{} has user functions of hash {}: pass their source with "
                              "--score-mod FILE and/or --mask-mod FILE",
                              where, variant.user_functions));
    if (variant.user_functions != functions->hash())
      throw Error(ErrorCode::invalid_argument,
                  fmt::format("{} has user functions of hash {}, but the sources given ({}) have "
                              "hash {}: expected the sources that variant was built from",
                              where, variant.user_functions, user_function_files(options),
                              functions->hash()));
    return variant;
  }
  if (!functions || !add) return variant;
  const FamilyInfo* info = family_info(variant.family);
  if (!compiles_user_functions(info, *functions))
    throw Error(ErrorCode::invalid_argument,
                fmt::format("{}: family {} compiles no user functions ({}{}): expected a variant "
                            "of {}",
                            where, variant.family, user_function_files(options),
                            info && info->user_functions
                                ? "; a backward needs the score_mod's --score-mod-grad"
                                : "",
                            user_function_families()));
  variant.user_functions = functions->hash();
  return variant;
}

std::vector<std::string> archs_of_local_gpus() {
  std::vector<DeviceInfo> found;
  try {
    found = devices();
  } catch (const Error& e) {
    throw Error(ErrorCode::invalid_argument,
                fmt::format("no GPU here to compile for, so pass --arch, e.g. --arch sm_90a or "
                            "--arch h100. Looking for a GPU: {}",
                            e.what()));
  }
  if (found.empty())
    throw Error(ErrorCode::invalid_argument,
                "no GPU here to compile for, so pass --arch, e.g. --arch sm_90a or --arch "
                "h100. Looking for a GPU: the CUDA driver sees none");
  std::vector<std::string> archs;
  for (const DeviceInfo& device : found)
    if (!contains(archs, device.arch)) archs.push_back(device.arch);
  return archs;
}

// The variants to build. With user functions (`functions`), `notes` gets the families the default
// set leaves out for them.
std::vector<Variant> chosen_variants(const PrecompileOptions& options,
                                     const UserFunctions* functions,
                                     std::vector<std::string>& notes) {
  std::vector<Variant> chosen;
  auto add = [&](Variant variant) {
    if (!contains(chosen, variant)) chosen.push_back(std::move(variant));
  };
  if (!options.variant_names.empty()) {
    for (const std::string& name : options.variant_names)
      add(with_user_functions(Variant::parse(name), functions, options, "--variant " + name,
                              /*add=*/true));
    return chosen;
  }
  if (!options.manifest.empty()) {
    // A manifest recorded on one GPU can warm another arch: each variant retargeted, checked
    // again for that arch. Its names are built as recorded: user functions make the hashes they
    // name buildable, and add none to the others (a recorded run holds both kinds).
    bool names_them = false;
    for (Variant recorded : read_variant_manifest(options.manifest)) {
      const std::string where = fmt::format("--manifest {}: {}", options.manifest, recorded.name());
      recorded = with_user_functions(std::move(recorded), functions, options, where,
                                     /*add=*/false);
      names_them = names_them || !recorded.user_functions.empty();
      if (options.archs.empty()) {
        add(recorded);
        continue;
      }
      for (const std::string& arch : options.archs) {
        Variant retargeted = recorded;
        retargeted.arch = arch;
        try {
          add(Variant::parse(retargeted.name()));
        } catch (const Error& e) {
          throw Error(ErrorCode::invalid_argument,
                      fmt::format("--manifest {}: {} cannot be built for {}: {}", options.manifest,
                                  recorded.name(), arch, e.what()));
        }
      }
    }
    if (chosen.empty())
      throw Error(ErrorCode::invalid_argument,
                  fmt::format("--manifest {} names no variant", options.manifest));
    if (functions && !names_them)
      throw Error(ErrorCode::invalid_argument,
                  fmt::format("--manifest {} names no variant with user functions, so {} (hash "
                              "{}) would be unused: expected a manifest with .user{} variants",
                              options.manifest, user_function_files(options), functions->hash(),
                              functions->hash()));
    return chosen;
  }
  const auto archs = options.archs.empty() ? archs_of_local_gpus() : options.archs;
  const auto head_dims = head_dims_or_all(options.head_dims);
  const auto dtypes = dtypes_or_all(options.dtypes);
  const auto causal = yes_no_values(options.causal);
  const auto softcap = yes_no_values(options.softcap);
  const auto window = yes_no_values(options.window);
  const auto sink = yes_no_values(options.sink);
  const auto alibi = yes_no_values(options.alibi);
  // Families the user named must compile user functions; of the default set, those that do not
  // are left out (and named in a note).
  if (functions)
    for (const std::string& family : options.families)
      if (const FamilyInfo* info = family_info(family); !compiles_user_functions(info, *functions))
        throw Error(ErrorCode::invalid_argument,
                    fmt::format("--family {}: it compiles no user functions ({}{}): expected "
                                "families among {}",
                                family, user_function_files(options),
                                info && info->user_functions
                                    ? "; a backward needs the score_mod's --score-mod-grad"
                                    : "",
                                user_function_families()));
  std::vector<std::string> skipped, need_grad;
  for (const std::string& arch : archs)
    for (const Variant& variant : default_variants(arch)) {
      if (!contains(head_dims, variant.head_dim) || !contains(dtypes, variant.dtype) ||
          !contains(causal, variant.causal))
        continue;
      if (!options.families.empty() && !contains(options.families, variant.family)) continue;
      // Each default shape once per --softcap, --window, --sink and --alibi value, where the
      // family builds soft-capped, sliding-window, sink or ALiBi kernels.
      const FamilyInfo* info = family_info(variant.family);
      if (functions && !compiles_user_functions(info, *functions)) {
        auto& list = info && info->user_functions ? need_grad : skipped;
        if (!contains(list, variant.family)) list.push_back(variant.family);
        continue;
      }
      for (bool capped : softcap)
        for (bool windowed : window)
          for (bool sunk : sink)
            for (bool biased : alibi) {
              if ((capped && !(info && info->softcap)) || (windowed && !(info && info->window)) ||
                  (sunk && !(info && info->sink)) || (biased && !(info && info->alibi)))
                continue;
              Variant chosen_variant = variant;
              chosen_variant.softcap = capped;
              chosen_variant.window = windowed;
              chosen_variant.sink = sunk;
              chosen_variant.alibi = biased;
              if (functions) chosen_variant.user_functions = functions->hash();
              add(std::move(chosen_variant));
            }
    }
  if (!skipped.empty())
    notes.push_back(fmt::format("{} {} no user functions: left out of this run (run "
                                "precompile without {} for their plain variants)",
                                skipped.size() == 1 ? "family" : "families",
                                fmt::join(skipped, ", "),
                                skipped.size() == 1 ? "compiles" : "compile",
                                user_function_files(options)));
  if (!need_grad.empty())
    notes.push_back(fmt::format("backward {} {}: left out of this run, because the backward of a "
                                "score_mod needs its derivative (--score-mod-grad FILE)",
                                need_grad.size() == 1 ? "family" : "families",
                                fmt::join(need_grad, ", ")));
  if (chosen.empty())
    throw Error(ErrorCode::invalid_argument,
                fmt::format("no default variant for {} matches --head-dim, --dtype, --causal, "
                            "--softcap, --window, --sink, --alibi{} and --family; `flashjit "
                            "precompile --arch {} --dry-run` lists them",
                            fmt::join(archs, ", "),
                            functions ? fmt::format(", user functions (families {})",
                                                    user_function_families())
                                      : "",
                            archs.front()));
  return chosen;
}

std::string seconds_text(double milliseconds) {
  if (milliseconds < 10) return fmt::format("{:.1f} ms", milliseconds);
  if (milliseconds < 1000) return fmt::format("{:.0f} ms", milliseconds);
  return fmt::format("{:.2f} s", milliseconds / 1000);
}

std::string outcome_line(const CompileOutcome& outcome, std::size_t index, std::size_t total,
                         std::size_t name_width) {
  const int count_width = static_cast<int>(fmt::formatted_size("{}", total));
  const std::string prefix = fmt::format("[{:>{}}/{}]", index, count_width, total);
  const std::string name = outcome.variant.name();
  if (!outcome.ok)
    return fmt::format("{} FAILED   {:<{}}  {:>8}  (error below)", prefix, name, name_width,
                       seconds_text(outcome.milliseconds));
  std::string line =
      fmt::format("{} {:<8} {:<{}}  {:>8}", prefix, outcome.was_cached ? "cached" : "compiled",
                  name, name_width, seconds_text(outcome.milliseconds));
  if (!outcome.was_cached && outcome.entry) {
    const CacheEntry& e = *outcome.entry;
    line += fmt::format("  {} regs, {} B spill, {} smem, {} cubin", e.registers, e.spill_bytes,
                        human_bytes(static_cast<std::uint64_t>(e.static_shared_bytes) +
                                    static_cast<std::uint64_t>(e.dynamic_shared_bytes)),
                        human_bytes(e.cubin_bytes));
  }
  return line;
}

int run_precompile(const PrecompileOptions& options, const GlobalOptions& globals) {
  // Made before the variants are chosen: a UserFunctions made in this process is what lets the
  // cache compile a variant that names its hash.
  std::optional<UserFunctions> functions;
  if (!options.score_mod_file.empty() || !options.mask_mod_file.empty())
    functions = UserFunctions::from_files(options.score_mod_file, options.mask_mod_file,
                                          options.score_mod_grad_file);
  std::vector<std::string> notes;
  const std::vector<Variant> variants =
      chosen_variants(options, functions ? &*functions : nullptr, notes);
  if (!globals.quiet) {
    // On stdout with the rest of the report; beside a dry run's names, on stderr.
    std::FILE* to = options.dry_run ? stderr : stdout;
    if (functions)
      fmt::print(to, "user functions {}: {}\n", functions->hash(), user_function_files(options));
    for (const std::string& note : notes) fmt::print(to, "note: {}\n", note);
  }
  if (options.dry_run) {
    for (const Variant& variant : variants) fmt::print("{}\n", variant.name());
    return 0;
  }
  GlobalOptions where = globals;
  if (!options.out.empty()) where.cache_dir = options.out;  // the bundle is the writable layer
  const auto cache = open_cache(where, /*need_disk=*/true);

  std::size_t name_width = 0;
  for (const Variant& variant : variants) name_width = std::max(name_width, variant.name().size());
  const bool bar = !globals.quiet && stdout_is_terminal();
  // On a terminal the bar stands in for the per-variant lines unless -v asks for them.
  const bool every_line = !globals.quiet && (!bar || globals.verbosity > 0);
  ProgressBar progress("compiling", variants.size(), bar);
  std::size_t finished = 0;
  const auto start = std::chrono::steady_clock::now();
  const auto outcomes =
      cache->precompile(variants, options.jobs, [&](const CompileOutcome& outcome) {
        ++finished;
        progress.advance(outcome.variant.name());
        if (every_line || (!outcome.ok && !globals.quiet))
          progress.print_line(outcome_line(outcome, finished, variants.size(), name_width));
      });
  progress.finish();
  const double wall_ms =
      std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - start).count();

  std::size_t compiled = 0, cached = 0, failed = 0;
  double compile_ms = 0, cached_ms = 0;
  std::vector<std::string> archs;
  for (const CompileOutcome& outcome : outcomes) {
    if (!contains(archs, outcome.variant.arch)) archs.push_back(outcome.variant.arch);
    if (!outcome.ok) {
      ++failed;
    } else if (outcome.was_cached) {
      ++cached;
      cached_ms += outcome.milliseconds;
    } else {
      ++compiled;
      compile_ms += outcome.milliseconds;
    }
  }
  if (!globals.quiet) {
    const int jobs = options.jobs > 0
                         ? options.jobs
                         : static_cast<int>(std::max(1u, std::thread::hardware_concurrency()));
    fmt::print(
        "{}: {} variants in {} ({} jobs): {} compiled{}, {} already cached{}, {} failed\n",
        fmt::join(archs, ", "), outcomes.size(), seconds_text(wall_ms),
        std::min<std::size_t>(static_cast<std::size_t>(jobs), outcomes.size()), compiled,
        compiled ? fmt::format(" ({} each on average)", seconds_text(compile_ms / compiled)) : "",
        cached,
        cached ? fmt::format(" ({} each on average)", seconds_text(cached_ms / cached)) : "",
        failed);
    fmt::print("cache: {}\n", describe_cache_location(*cache));
  }
  if (failed == 0 && !options.out.empty()) {
    const std::filesystem::path manifest = std::filesystem::path(options.out) / kBundleManifest;
    write_variant_manifest(manifest, variants);
    // Others read a bundle (it is built to be shipped); a cache directory stays private (0700).
    std::filesystem::permissions(
        options.out, std::filesystem::perms::owner_all | std::filesystem::perms::group_read |
                         std::filesystem::perms::group_exec | std::filesystem::perms::others_read |
                         std::filesystem::perms::others_exec);
    if (!globals.quiet)
      fmt::print(
          "bundle: {} ({} variants; serve it read-only with FLASHJIT_CACHE_PATH or "
          "CacheOptions::read_only_dirs)\n",
          manifest.string(), variants.size());
  }
  if (failed == 0) return 0;
  std::fflush(stdout);
  fmt::print(stderr, "flashjit: error: {} of {} variants failed:\n", failed, outcomes.size());
  for (const CompileOutcome& outcome : outcomes) {
    if (outcome.ok) continue;
    fmt::print(stderr, "\n=== {}\n{}\n", outcome.variant.name(), outcome.error);
    // NVRTC's log names the user's lines "score_mod(LINE)", "mask_mod(LINE)" or
    // "score_mod_grad(LINE)": say which files.
    if (!outcome.variant.user_functions.empty()) {
      if (!options.score_mod_file.empty())
        fmt::print(stderr, "score_mod = {}\n", options.score_mod_file);
      if (!options.mask_mod_file.empty())
        fmt::print(stderr, "mask_mod = {}\n", options.mask_mod_file);
      if (!options.score_mod_grad_file.empty())
        fmt::print(stderr, "score_mod_grad = {}\n", options.score_mod_grad_file);
    }
  }
  return 1;
}

}  // namespace

void add_precompile_command(CLI::App& app, const GlobalOptions& globals, int& status) {
  auto options = std::make_shared<PrecompileOptions>();
  CLI::App* command = app.add_subcommand(
      "precompile",
      "Compile the default variants for a GPU arch into the cache (no GPU needed with --arch)");
  auto* arch = add_archs_option(*command, options->archs,
                                "Target arch(s): sm_90a, sm_90, 90, 9.0, h100, h200, a100, ... "
                                "(default: the GPUs found here)");
  auto* head_dim = add_head_dim_option(*command, options->head_dims);
  auto* causal = add_causal_option(*command, options->causal);
  auto* softcap = add_softcap_option(*command, options->softcap);
  auto* window = add_window_option(*command, options->window);
  auto* sink = add_sink_option(*command, options->sink);
  auto* alibi = add_alibi_option(*command, options->alibi);
  auto* dtype = add_dtype_option(*command, options->dtypes);
  auto* family = add_family_option(*command, options->families,
                                   "Kernel families (default: every one that runs on the arch)");
  command
      ->add_option("--variant", options->variant_names,
                   "Compile exactly this variant (repeatable), e.g. "
                   "simt.sm90a.bf16.d128.m64n64s1.causal; `flashjit list` shows names")
      ->check(variant_name_validator())
      ->excludes(arch)
      ->excludes(head_dim)
      ->excludes(causal)
      ->excludes(softcap)
      ->excludes(window)
      ->excludes(sink)
      ->excludes(alibi)
      ->excludes(dtype)
      ->excludes(family)
      ->type_name("NAME");
  command
      ->add_option("--score-mod", options->score_mod_file,
                   "CUDA C source of a score_mod (flashjit::UserFunctions) compiled into every "
                   "variant; default variants of families without user functions are left out")
      ->check(CLI::ExistingFile)
      ->type_name("FILE");
  command
      ->add_option("--mask-mod", options->mask_mod_file,
                   "CUDA C source of a mask_mod, as --score-mod (either or both)")
      ->check(CLI::ExistingFile)
      ->type_name("FILE");
  command
      ->add_option("--score-mod-grad", options->score_mod_grad_file,
                   "CUDA C source of the score_mod's derivative, score_mod_grad (needs "
                   "--score-mod): without it the backward families are left out")
      ->check(CLI::ExistingFile)
      ->type_name("FILE");
  command
      ->add_option("--manifest", options->manifest,
                   "Compile exactly the variants of this manifest (FLASHJIT_RECORD writes one), "
                   "for each --arch if given")
      ->check(CLI::ExistingFile)
      ->excludes(head_dim)
      ->excludes(causal)
      ->excludes(softcap)
      ->excludes(window)
      ->excludes(sink)
      ->excludes(alibi)
      ->excludes(dtype)
      ->excludes(family)
      ->excludes("--variant")
      ->type_name("FILE");
  command
      ->add_option("--out", options->out,
                   "Write a relocatable bundle into DIR (its entries and flashjit-manifest.txt), "
                   "instead of the cache")
      ->type_name("DIR");
  command->add_option("-j,--jobs", options->jobs, "Parallel compilations (default: all cores)")
      ->check(non_negative())
      ->type_name("N");
  command->add_flag("--dry-run", options->dry_run, "Print the variant names, compile nothing");
  command->callback([&globals, &status, options] { status = run_precompile(*options, globals); });
}

}  // namespace flashjit::cli

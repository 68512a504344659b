// The flashjit command-line tool, run as a subprocess against a fresh cache directory: what a
// user on a build machine without a GPU does (precompile for an arch, list, prune), and the
// errors a mistyped flag gets.
#include <doctest/doctest.h>
#include <fmt/format.h>
#include <fmt/ranges.h>
#include <stdlib.h>
#include <sys/wait.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <sstream>
#include <regex>
#include <set>
#include <string>

#include "flashjit/flashjit.hpp"

namespace fs = std::filesystem;
using nlohmann::json;

namespace {

const fs::path kCli = FLASHJIT_BINARY_DIR "/tools/flashjit";

// A cache directory of its own per test, removed afterwards.
struct TempCache {
  fs::path dir;
  TempCache() {
    std::string pattern = (fs::temp_directory_path() / "flashjit-cli-test-XXXXXX").string();
    REQUIRE(::mkdtemp(pattern.data()) != nullptr);
    dir = pattern;
  }
  ~TempCache() {
    std::error_code ignored;
    fs::remove_all(dir, ignored);
  }
};

struct Run {
  int status = -1;
  std::string out;  // stdout
  std::string err;  // stderr
};

// Runs `flashjit <args>` through the shell; `env` is prefixed (e.g. "FLASHJIT_CACHE_DIR=/x").
Run run_cli(const TempCache& scratch, const std::string& args, const std::string& env = "") {
  REQUIRE_MESSAGE(fs::exists(kCli), "the flashjit CLI is not built at ", kCli.string());
  const fs::path err_file = scratch.dir / "stderr.txt";
  const std::string command =
      fmt::format("{} {} {} 2>{}", env, kCli.string(), args, err_file.string());
  Run run;
  FILE* pipe = ::popen(command.c_str(), "r");
  REQUIRE(pipe != nullptr);
  char buffer[4096];
  for (size_t n; (n = std::fread(buffer, 1, sizeof(buffer), pipe)) > 0;) run.out.append(buffer, n);
  const int status = ::pclose(pipe);
  run.status = WIFEXITED(status) ? WEXITSTATUS(status) : -1;
  std::ifstream err(err_file);
  std::stringstream text;
  text << err.rdbuf();
  run.err = text.str();
  fs::remove(err_file);
  return run;
}

bool contains(const std::string& text, const std::string& part) {
  return text.find(part) != std::string::npos;
}

const flashjit::FamilyInfo& family_info(const std::string& name) {
  const auto& all = flashjit::families();
  const auto found = std::find_if(all.begin(), all.end(),
                                  [&](const flashjit::FamilyInfo& f) { return f.name == name; });
  REQUIRE(found != all.end());
  return *found;
}

// The variants `precompile --arch sm_90a --head-dim 64 --dtype bf16 --causal no` must build.
std::vector<std::string> expected_d64_bf16_names() {
  std::vector<std::string> names;
  for (const flashjit::Variant& v : flashjit::default_variants("sm_90a"))
    if (v.head_dim == 64 && v.dtype == flashjit::DType::bf16 && !v.causal)
      names.push_back(v.name());
  std::sort(names.begin(), names.end());
  return names;
}

bool gpu_present() {
  try {
    return !flashjit::devices().empty();
  } catch (const flashjit::Error&) {
    return false;
  }
}

}  // namespace

TEST_CASE("precompile --arch fills the cache without a GPU, list --json describes every entry") {
  TempCache cache;
  const std::string dir = "--cache-dir " + cache.dir.string();
  const auto expected = expected_d64_bf16_names();
  REQUIRE(!expected.empty());

  const Run cold = run_cli(cache, dir +
                                      " precompile --arch sm_90a --head-dim 64 --dtype bf16 "
                                      "--causal no");
  INFO(cold.out, cold.err);
  REQUIRE(cold.status == 0);
  CHECK(contains(cold.out, fmt::format("{} variants", expected.size())));
  CHECK(contains(cold.out, fmt::format("{} compiled", expected.size())));
  CHECK(contains(cold.out, "0 already cached"));
  CHECK(contains(cold.out, "0 failed"));

  const Run listed = run_cli(cache, dir + " list --json");
  REQUIRE(listed.status == 0);
  const json entries = json::parse(listed.out);
  REQUIRE(entries.is_array());
  std::vector<std::string> names;
  for (const json& entry : entries) {
    for (const char* key : {"name", "family", "arch", "dtype", "head_dim", "causal", "tile_m",
                            "tile_n", "stages", "registers", "spill_bytes", "shared_mem_bytes",
                            "cubin_bytes", "compile_ms", "nvrtc_version", "created", "path"})
      CHECK_MESSAGE(entry.contains(key), "list --json lacks '", key, "' in ", entry.dump());
    const auto variant = flashjit::Variant::parse(entry.at("name").get<std::string>());
    CHECK(entry.at("arch") == "sm_90a");
    CHECK(entry.at("family") == variant.family);
    CHECK(entry.at("head_dim") == 64);
    CHECK(entry.at("dtype") == "bf16");
    CHECK(entry.at("causal") == false);
    CHECK(entry.at("tile_m") == variant.tile_m);
    CHECK(entry.at("registers").get<int>() > 0);
    CHECK(entry.at("compile_ms").get<double>() > 0);
    CHECK(entry.at("nvrtc_version") == flashjit::nvrtc_version());
    const fs::path cubin = entry.at("path").get<std::string>();
    CHECK(cubin.parent_path() == cache.dir);
    REQUIRE(fs::exists(cubin));
    CHECK(entry.at("cubin_bytes").get<std::uintmax_t>() == fs::file_size(cubin));
    names.push_back(entry.at("name"));
  }
  std::sort(names.begin(), names.end());
  CHECK(names == expected);

  // The same request again is served from disk: no NVRTC run.
  const Run warm = run_cli(cache, dir +
                                      " precompile --arch h200 --head-dim 64 --dtype bf16 "
                                      "--causal no");
  INFO(warm.out, warm.err);
  REQUIRE(warm.status == 0);
  CHECK(contains(warm.out, "0 compiled"));
  CHECK(contains(warm.out, fmt::format("{} already cached", expected.size())));
  CHECK_FALSE(contains(warm.out, "] compiled"));

  const Run table = run_cli(cache, dir + " list");
  REQUIRE(table.status == 0);
  for (const std::string& name : expected) CHECK(contains(table.out, name));
  CHECK(contains(table.out, fmt::format("{} entries", expected.size())));
}

TEST_CASE("the cache directory comes from FLASHJIT_CACHE_DIR when --cache-dir is absent") {
  TempCache cache;
  const std::string env = "FLASHJIT_CACHE_DIR=" + cache.dir.string();
  const Run compiled = run_cli(cache, "precompile --variant simt.sm80.bf16.d64.m64n64s1", env);
  INFO(compiled.out, compiled.err);
  REQUIRE(compiled.status == 0);
  CHECK(contains(compiled.out, "1 compiled"));
  CHECK(contains(compiled.out, "cache: " + cache.dir.string()));

  // Global options may also follow the subcommand; --arch takes product names.
  const Run listed =
      run_cli(cache, fmt::format("list --arch a100 --json --cache-dir {}", cache.dir.string()));
  REQUIRE(listed.status == 0);
  const json entries = json::parse(listed.out);
  REQUIRE(entries.size() == 1);
  CHECK(entries[0].at("name") == "simt.sm80.bf16.d64.m64n64s1");

  const Run info = run_cli(cache, "info --json", env);
  REQUIRE(info.status == 0);
  const json doc = json::parse(info.out);
  CHECK(doc.at("flashjit_version") == std::string(flashjit::version()));
  CHECK(doc.at("nvrtc_version") == flashjit::nvrtc_version());
  const auto archs = doc.at("nvrtc_archs").get<std::vector<std::string>>();
  CHECK(std::find(archs.begin(), archs.end(), "sm_90a") != archs.end());
  CHECK(doc.at("cache").at("dir") == cache.dir.string());
  CHECK(doc.at("cache").at("entries") == 1);
  CHECK(doc.at("cache").at("bytes").get<std::uint64_t>() > 0);
  CHECK(doc.at("gpus").is_array());
  CHECK(doc.at("gpu_error").is_null() == gpu_present());
  for (const json& family : doc.at("families")) {
    INFO(family.at("name"));
    CHECK(family.at("sink") == (family.at("name") != "simt" && family.at("attention")));
    // The backward's gradient kernels build ALiBi (and softcap) but need no sink variants.
    CHECK(family.at("alibi") ==
          (family.at("sink").get<bool>() || (family.at("backward") && family.at("softcap"))));
  }
  // The user-function flags are the library's (FamilyInfo), and a block mask needs them.
  REQUIRE(doc.at("families").size() == flashjit::families().size());
  for (std::size_t i = 0; i < flashjit::families().size(); ++i) {
    const flashjit::FamilyInfo& info = flashjit::families()[i];
    const json& family = doc.at("families")[i];
    INFO(info.name);
    CHECK(family.at("name") == info.name);
    CHECK(family.at("backward") == info.backward);
    CHECK(family.at("user_functions") == info.user_functions);
    CHECK(family.at("block_mask") == info.block_mask);
    CHECK(family.at("paged_kv") == info.paged_kv);
    CHECK(family.at("varlen") == info.varlen);
    CHECK(family.at("split_kv") == info.split_kv);
    // Forward families (wgmma) and the backward's gradient kernels take block masks.
    if (info.block_mask) CHECK((info.user_functions && (info.attention || info.backward)));
  }
  const Run text = run_cli(cache, "info", env);
  REQUIRE(text.status == 0);
  for (const flashjit::FamilyInfo& info : flashjit::families()) {
    std::istringstream lines(text.out);
    std::string line;
    while (std::getline(lines, line) && !line.starts_with("family " + info.name + " ")) {
    }
    INFO(line);
    CHECK(contains(line, "; backward pass") == info.backward);
    CHECK(contains(line, "; user functions") == info.user_functions);
    CHECK(contains(line, "; block mask") == info.block_mask);
    CHECK(contains(line, "; paged KV") == info.paged_kv);
    CHECK(contains(line, "; varlen") == info.varlen);
    CHECK(contains(line, "; split-KV") == info.split_kv);
  }
  // Paged caches: the decode kernels and the prefill kernels of Hopper and sm_80+; split keys:
  // decode only.
  for (const flashjit::FamilyInfo& info : flashjit::families()) {
    INFO(info.name);
    CHECK(info.paged_kv == (info.name == "decode" || info.name == "decode_tma" ||
                            info.name == "wgmma" || info.name == "mma"));
    CHECK(info.split_kv == info.name.starts_with("decode"));
  }
}

TEST_CASE("an empty cache lists as empty, not as an error") {
  TempCache cache;
  const std::string dir = "--cache-dir " + cache.dir.string();
  const Run table = run_cli(cache, dir + " list");
  CHECK(table.status == 0);
  CHECK(contains(table.out, "no cached kernels"));
  const Run listed = run_cli(cache, dir + " list --json");
  CHECK(listed.status == 0);
  CHECK(json::parse(listed.out) == json::array());
  const Run text = run_cli(cache, dir + " info");
  CHECK(text.status == 0);
  CHECK(contains(text.out, "NVRTC"));
  // The label column is as wide as the longest label ("family decode_tma").
  CHECK(std::regex_search(text.out, std::regex("\nentries +0 \\(")));
}

TEST_CASE("clear removes one arch or all; prune removes the least recently used first") {
  TempCache cache;
  const std::string dir = "--cache-dir " + cache.dir.string();
  const Run compiled = run_cli(
      cache, dir +
                 " precompile --variant simt.sm80.bf16.d64.m64n64s1 "
                 "--variant simt.sm86.bf16.d64.m64n64s1 --variant simt.sm89.bf16.d64.m64n64s1");
  INFO(compiled.out, compiled.err);
  REQUIRE(compiled.status == 0);
  auto entries = [&] { return json::parse(run_cli(cache, dir + " list --json").out); };
  REQUIRE(entries().size() == 3);

  // Ages that make the order unambiguous: sm89 least recently used, then sm80, then sm86.
  const auto now = fs::file_time_type::clock::now();
  std::uint64_t total = 0;
  for (const json& entry : entries()) {
    const fs::path cubin = entry.at("path").get<std::string>();
    total += entry.at("cubin_bytes").get<std::uint64_t>();
    const std::string arch = entry.at("arch");
    const auto age = arch == "sm_89"   ? std::chrono::hours(3)
                     : arch == "sm_80" ? std::chrono::hours(2)
                                       : std::chrono::hours(1);
    fs::last_write_time(cubin, now - age);
  }
  const Run pruned = run_cli(cache, fmt::format("{} prune --max-size {}", dir, total - 1));
  INFO(pruned.out, pruned.err);
  REQUIRE(pruned.status == 0);
  CHECK(contains(pruned.out, "removed 1 entries"));
  auto remaining = entries();
  REQUIRE(remaining.size() == 2);
  for (const json& entry : remaining) CHECK(entry.at("arch") != "sm_89");

  const Run cleared_one = run_cli(cache, dir + " clear --arch 8.6");
  REQUIRE(cleared_one.status == 0);
  CHECK(contains(cleared_one.out, "removed 1 entries for sm_86"));
  remaining = entries();
  REQUIRE(remaining.size() == 1);
  CHECK(remaining[0].at("arch") == "sm_80");

  const Run pruned_all = run_cli(cache, dir + " prune --max-size 0");
  REQUIRE(pruned_all.status == 0);
  CHECK(entries().empty());

  REQUIRE(run_cli(cache, dir + " precompile --variant simt.sm80.bf16.d64.m64n64s1").status == 0);
  REQUIRE(entries().size() == 1);
  const Run cleared = run_cli(cache, dir + " clear");
  CHECK(cleared.status == 0);
  CHECK(contains(cleared.out, "removed 1 entries"));
  CHECK(entries().empty());
}

TEST_CASE("bad flags exit 2 with a message naming the flag and the values it takes") {
  TempCache cache;
  const std::string dir = "--cache-dir " + cache.dir.string();
  auto fails = [&](const std::string& args) {
    const Run run = run_cli(cache, dir + " " + args);
    INFO(args, "\nstdout: ", run.out, "\nstderr: ", run.err);
    CHECK(run.status == 2);
    return run.err;
  };

  std::string err = fails("precompile --arch sm_91");
  CHECK(contains(err, "--arch"));
  CHECK(contains(err, "unknown arch 'sm_91'"));
  CHECK(contains(err, "sm_90a"));
  CHECK(contains(err, "h100"));

  err = fails("precompile --arch sm_90a --causal maybe");
  CHECK(contains(err, "--causal"));
  CHECK(contains(err, "maybe"));
  CHECK(contains(err, "yes"));

  err = fails("precompile --arch sm_90a --window sometimes");
  CHECK(contains(err, "--window"));
  CHECK(contains(err, "sometimes"));

  err = fails("precompile --arch sm_90a --sink sometimes");
  CHECK(contains(err, "--sink"));
  CHECK(contains(err, "sometimes"));
  err = fails("precompile --variant simt.sm80.bf16.d64.m64n64s1 --sink yes");
  CHECK(contains(err, "excludes"));

  err = fails("precompile --arch sm_90a --alibi often");
  CHECK(contains(err, "--alibi"));
  CHECK(contains(err, "often"));
  err = fails("precompile --variant simt.sm80.bf16.d64.m64n64s1 --alibi yes");
  CHECK(contains(err, "excludes"));

  err = fails("precompile --arch sm_90a --softcap maybe");
  CHECK(contains(err, "--softcap"));
  CHECK(contains(err, "maybe"));

  err = fails("precompile --arch sm_90a --head-dim 100");
  CHECK(contains(err, "--head-dim"));
  CHECK(contains(err, "100"));

  err = fails("precompile --arch sm_90a --dtype fp8");
  CHECK(contains(err, "--dtype"));
  CHECK(contains(err, "fp8"));

  err = fails("precompile --variant simt.sm90a.bf16.d100.m64n64s1");
  CHECK(contains(err, "--variant"));
  CHECK(contains(err, "head_dim 100"));
  err = fails("precompile --variant fast-attention");
  CHECK(contains(err, "expected <family>"));
  err = fails("precompile --variant simt.sm80.bf16.d64.m64n64s1 --arch sm_90a");
  CHECK(contains(err, "excludes"));

  err = fails("precompile --arch sm_90a --jobs -1");
  CHECK(contains(err, "--jobs"));

  err = fails("prune");
  CHECK(contains(err, "--max-size"));
  err = fails("prune --max-size lots");
  CHECK(contains(err, "--max-size"));

  err = fails("list --arch sm_7");
  CHECK(contains(err, "unknown arch"));

  err = fails("");
  CHECK(contains(err, "subcommand"));
  err = fails("compile");
  CHECK(contains(err, "unknown subcommand 'compile'"));
  CHECK(contains(err, "precompile"));
  err = fails("-v -q info");
  CHECK(contains(err, "excludes"));

  // Nothing was compiled by any of them.
  CHECK(json::parse(run_cli(cache, dir + " list --json").out).empty());
}

TEST_CASE("a variant that fails to compile makes precompile exit 1 with its NVRTC log") {
  TempCache cache;
  // A copy of the kernel sources with a syntax error in the simt kernel only.
  const fs::path kernels = cache.dir / "kernels";
  fs::copy(FLASHJIT_SOURCE_DIR "/kernels_src", kernels, fs::copy_options::recursive);
  REQUIRE(fs::exists(kernels / "simt/kernel.cu"));
  std::ofstream(kernels / "simt/kernel.cu", std::ios::app) << "\nthis_is_not_cuda;\n";

  const std::string dir = "--cache-dir " + (cache.dir / "cache").string();
  const Run run = run_cli(cache,
                          dir +
                              " precompile --variant simt.sm80.bf16.d64.m64n64s1 "
                              "--variant simt.sm80.bf16.d64.m64n64s1.causal",
                          "FLASHJIT_KERNELS_DIR=" + kernels.string());
  INFO(run.out, run.err);
  CHECK(run.status == 1);
  CHECK(contains(run.out, "FAILED"));
  CHECK(contains(run.out, "0 compiled"));
  CHECK(contains(run.out, "2 failed"));
  CHECK(contains(run.err, "2 of 2 variants failed"));
  CHECK(contains(run.err, "=== simt.sm80.bf16.d64.m64n64s1\n"));
  CHECK(contains(run.err, "=== simt.sm80.bf16.d64.m64n64s1.causal\n"));
  CHECK(contains(run.err, "this_is_not_cuda"));  // the NVRTC log quotes the bad line
  CHECK(json::parse(run_cli(cache, dir + " list --json").out).empty());
}

TEST_CASE("precompile without --arch targets the GPU here, or says to pass --arch") {
  TempCache cache;
  const Run run = run_cli(cache, "--cache-dir " + cache.dir.string() + " precompile --dry-run");
  INFO(run.out, run.err);
  if (gpu_present()) {
    REQUIRE(run.status == 0);
    std::string expected;
    for (const auto& v : flashjit::default_variants(flashjit::devices().front().arch))
      expected += v.name() + "\n";
    CHECK(run.out == expected);
  } else {
    CHECK(run.status == 2);
    CHECK(contains(run.err, "no GPU"));
    CHECK(contains(run.err, "pass --arch"));
  }
}

TEST_CASE("precompile --dry-run lists the default set and compiles nothing") {
  TempCache cache;
  const std::string dir = "--cache-dir " + cache.dir.string();
  const Run run = run_cli(cache, dir + " precompile --arch sm_90a --dry-run");
  REQUIRE(run.status == 0);
  std::string expected;
  for (const flashjit::Variant& v : flashjit::default_variants("sm_90a"))
    expected += v.name() + "\n";
  CHECK(run.out == expected);
  CHECK(json::parse(run_cli(cache, dir + " list --json").out).empty());
  // --softcap yes: the soft-capped twin of every default variant whose family builds them (the
  // attention families; no merge or backward kernel).
  const Run capped = run_cli(cache, dir + " precompile --arch sm_90a --softcap yes --dry-run");
  REQUIRE(capped.status == 0);
  std::string expected_capped;
  for (flashjit::Variant v : flashjit::default_variants("sm_90a"))
    if (family_info(v.family).softcap) {
      v.softcap = true;
      expected_capped += v.name() + "\n";
    }
  CHECK(capped.out == expected_capped);

  // --window yes: the sliding-window twins, of the families that build them (all attention
  // families but simt).
  const Run windowed = run_cli(cache, dir + " precompile --arch sm_90a --window yes --dry-run");
  REQUIRE(windowed.status == 0);
  std::string expected_windowed;
  for (flashjit::Variant v : flashjit::default_variants("sm_90a"))
    if (family_info(v.family).window) {
      v.window = true;
      expected_windowed += v.name() + "\n";
    }
  CHECK(windowed.out == expected_windowed);

  // --sink yes: the attention-sink twins, of the families that build them (all attention
  // families but simt); with --window both, each shape windowless and windowed.
  const Run sunk = run_cli(cache, dir + " precompile --arch sm_90a --sink yes --dry-run");
  REQUIRE(sunk.status == 0);
  std::string expected_sunk, expected_sunk_windows;
  for (flashjit::Variant v : flashjit::default_variants("sm_90a"))
    if (family_info(v.family).sink) {
      REQUIRE(family_info(v.family).window);  // the sink families build windows too
      v.sink = true;
      expected_sunk += v.name() + "\n";
      expected_sunk_windows += v.name() + "\n";
      v.window = true;
      expected_sunk_windows += v.name() + "\n";
    }
  CHECK(sunk.out == expected_sunk);
  const Run sunk_windows =
      run_cli(cache, dir + " precompile --arch sm_90a --sink yes --window both --dry-run");
  REQUIRE(sunk_windows.status == 0);
  CHECK(sunk_windows.out == expected_sunk_windows);

  // --alibi both: each default shape without and with ALiBi, the latter only where the family
  // builds it (all attention families but simt); with --sink yes, the sink twins of both.
  const Run biased = run_cli(cache, dir + " precompile --arch sm_90a --alibi both --dry-run");
  REQUIRE(biased.status == 0);
  std::string expected_biased, expected_biased_sinks;
  for (flashjit::Variant v : flashjit::default_variants("sm_90a")) {
    expected_biased += v.name() + "\n";
    if (!family_info(v.family).alibi) continue;
    v.alibi = true;
    expected_biased += v.name() + "\n";
    if (!family_info(v.family).sink) continue;  // the backward's: ALiBi without sink variants
    v.sink = true;
    v.alibi = false;
    expected_biased_sinks += v.name() + "\n";
    v.alibi = true;
    expected_biased_sinks += v.name() + "\n";
  }
  CHECK(biased.out == expected_biased);
  const Run biased_sinks =
      run_cli(cache, dir + " precompile --arch sm_90a --alibi both --sink yes --dry-run");
  REQUIRE(biased_sinks.status == 0);
  CHECK(biased_sinks.out == expected_biased_sinks);
}

TEST_CASE("precompile --alibi both builds the ALiBi twins; list and its JSON show them") {
  TempCache cache;
  const std::string dir = "--cache-dir " + cache.dir.string();
  const Run compiled = run_cli(cache, dir +
                                          " precompile --arch sm_80 --family mma --head-dim 64 "
                                          "--dtype bf16 --causal no --alibi both -j 2");
  INFO(compiled.out, compiled.err);
  REQUIRE(compiled.status == 0);
  std::vector<std::string> expected;
  for (flashjit::Variant v : flashjit::default_variants("sm_80"))
    if (v.family == "mma" && v.head_dim == 64 && v.dtype == flashjit::DType::bf16 && !v.causal) {
      expected.push_back(v.name());
      v.alibi = true;
      expected.push_back(v.name());
    }
  REQUIRE(expected.size() >= 2);
  CHECK(contains(compiled.out, fmt::format("{} compiled", expected.size())));
  CHECK(contains(compiled.out, "0 failed"));

  const Run table = run_cli(cache, dir + " list");
  REQUIRE(table.status == 0);
  for (const std::string& name : expected) CHECK(contains(table.out, name));
  const Run listed = run_cli(cache, dir + " list --json");
  REQUIRE(listed.status == 0);
  std::vector<std::string> names;
  for (const json& entry : json::parse(listed.out)) {
    const std::string name = entry.at("name");
    INFO(name);
    CHECK(entry.at("alibi") == name.ends_with(".alibi"));
    CHECK(entry.at("sink") == false);
    names.push_back(name);
  }
  std::sort(names.begin(), names.end());
  std::sort(expected.begin(), expected.end());
  CHECK(names == expected);
}

// A mask_mod and a score_mod in files, as an operator passes them to precompile.
struct UserSources {
  fs::path mask_mod, score_mod, broken;
  explicit UserSources(const fs::path& dir)
      : mask_mod(dir / "doc_mask.cu"), score_mod(dir / "bias.cu"), broken(dir / "broken.cu") {
    std::ofstream(mask_mod)
        << "__device__ bool mask_mod(int b, int h, int q, int k, const flashjit::UserArgs& a) {\n"
           "  const int* doc = static_cast<const int*>(a.ptr[0]);\n"
           "  return doc[q] == doc[k];\n}\n";
    std::ofstream(score_mod) << "__device__ float score_mod(float s, int b, int h, int q, int k,\n"
                                "                           const flashjit::UserArgs& a) {\n"
                                "  return s + static_cast<const float*>(a.ptr[1])[h];\n}\n";
    std::ofstream(broken) << "// line 1\n__device__ float score_mod(float s, int b, int h, int q, "
                             "int k, const flashjit::UserArgs& a) {\n"
                             "  return s + no_such_name;\n}\n";
  }
};

std::vector<std::string> lines_of(const std::string& text) {
  std::vector<std::string> lines;
  std::istringstream in(text);
  for (std::string line; std::getline(in, line);) lines.push_back(line);
  return lines;
}

TEST_CASE("precompile --mask-mod / --score-mod: the default set of the families that compile "
          "user functions, each with their hash; the others left out with a note") {
  TempCache cache;
  const UserSources sources(cache.dir);
  const std::string hash = flashjit::UserFunctions::from_files("", sources.mask_mod).hash();
  const std::string dir = "--cache-dir " + cache.dir.string();
  const Run run = run_cli(cache, dir + " precompile --arch sm_90a --head-dim 64 --dtype bf16 "
                                       "--mask-mod " + sources.mask_mod.string() + " --dry-run");
  INFO(run.out, run.err);
  REQUIRE(run.status == 0);
  std::vector<std::string> expected, left_out;
  for (flashjit::Variant v : flashjit::default_variants("sm_90a")) {
    if (v.head_dim != 64 || v.dtype != flashjit::DType::bf16) continue;
    const auto info = std::find_if(flashjit::families().begin(), flashjit::families().end(),
                                   [&](const auto& f) { return f.name == v.family; });
    if (!info->user_functions) {
      if (std::find(left_out.begin(), left_out.end(), v.family) == left_out.end())
        left_out.push_back(v.family);
      continue;
    }
    v.user_functions = hash;
    expected.push_back(v.name());
  }
  REQUIRE(!expected.empty());
  REQUIRE(!left_out.empty());  // simt and merge today
  auto names = lines_of(run.out);
  std::sort(names.begin(), names.end());
  std::sort(expected.begin(), expected.end());
  CHECK(names == expected);
  // The hash and the note on stderr, beside a dry run's names.
  CHECK(contains(run.err, "user functions " + hash + ": --mask-mod " + sources.mask_mod.string()));
  for (const std::string& family : left_out) CHECK(contains(run.err, family));
  CHECK(contains(run.err, "no user functions: left out of this run"));

  // Both sources: one hash of the two.
  const Run both = run_cli(cache, dir + " precompile --arch sm_80 --family mma --head-dim 64 "
                                        "--dtype bf16 --causal yes --score-mod " +
                                        sources.score_mod.string() + " --mask-mod " +
                                        sources.mask_mod.string() + " --dry-run");
  REQUIRE(both.status == 0);
  const std::string both_hash =
      flashjit::UserFunctions::from_files(sources.score_mod, sources.mask_mod).hash();
  CHECK(both_hash != hash);
  // The mma family's default set has a varlen twin of each variant, and both over pages.
  CHECK(both.out == "mma.sm80.bf16.d64.m128n128s1.causal.user" + both_hash + "\n" +
                        "mma.sm80.bf16.d64.m128n128s1.causal.varlen.user" + both_hash + "\n" +
                        "mma.sm80.bf16.d64.m128n128s1.causal.paged.user" + both_hash + "\n" +
                        "mma.sm80.bf16.d64.m128n128s1.causal.paged.varlen.user" + both_hash +
                        "\n");
}

TEST_CASE("precompile --score-mod: the backward families need --score-mod-grad, named in a note "
          "or an error") {
  TempCache cache;
  const UserSources sources(cache.dir);
  const fs::path grad = cache.dir / "bias_grad.cu";
  std::ofstream(grad) << "__device__ float score_mod_grad(float s, int b, int h, int q, int k,\n"
                         "                                const flashjit::UserArgs& a) {\n"
                         "  return 1.f;\n}\n";
  const std::string dir = "--cache-dir " + cache.dir.string();
  const std::string base = dir + " precompile --arch sm_80 --head-dim 64 --dtype bf16 --causal yes "
                                 "--score-mod " + sources.score_mod.string();
  auto families_of = [](const std::string& names) {
    std::set<std::string> families;
    for (const std::string& name : lines_of(names)) families.insert(name.substr(0, name.find('.')));
    return families;
  };
  // Without the derivative: the forward families only, and a note naming the backward ones.
  const Run forward_only = run_cli(cache, base + " --dry-run");
  INFO(forward_only.out, forward_only.err);
  REQUIRE(forward_only.status == 0);
  const std::set<std::string> forward_families = families_of(forward_only.out);
  CHECK(forward_families.count("mma") == 1);
  CHECK(forward_families.count("bwd_mma") == 0);
  CHECK(contains(forward_only.err, "backward families bwd_mma, bwd_mma_dq: left out"));
  CHECK(contains(forward_only.err, "--score-mod-grad FILE"));
  // With it: the backward's dK/dV and dQ families too, under the hash of all three sources.
  const Run with_grad = run_cli(cache, base + " --score-mod-grad " + grad.string() + " --dry-run");
  INFO(with_grad.err);
  REQUIRE(with_grad.status == 0);
  const std::set<std::string> all = families_of(with_grad.out);
  CHECK(all.count("bwd_mma") == 1);
  CHECK(all.count("bwd_mma_dq") == 1);
  const std::string hash = flashjit::UserFunctions::from_files(sources.score_mod, "", grad).hash();
  for (const std::string& name : lines_of(with_grad.out)) CHECK(name.ends_with(".user" + hash));
  // A backward family asked for by name without the derivative: an error that says what is missing.
  const Run refused = run_cli(cache, base + " --family bwd_mma --dry-run");
  CHECK(refused.status != 0);
  CHECK(contains(refused.err, "--family bwd_mma"));
  CHECK(contains(refused.err, "a backward needs the score_mod's --score-mod-grad"));
}

TEST_CASE("precompile with user functions compiles them in; list, its JSON and the metadata "
          "carry the hash; NVRTC errors name the file") {
  TempCache cache;
  const UserSources sources(cache.dir);
  const std::string dir = "--cache-dir " + (cache.dir / "cache").string();
  const std::string hash =
      flashjit::UserFunctions::from_files(sources.score_mod, sources.mask_mod).hash();
  const Run compiled = run_cli(cache, dir + " precompile --variant mma.sm80.bf16.d64.m64n64s1 "
                                            "--score-mod " + sources.score_mod.string() +
                                            " --mask-mod " + sources.mask_mod.string());
  INFO(compiled.out, compiled.err);
  REQUIRE(compiled.status == 0);
  const std::string name = "mma.sm80.bf16.d64.m64n64s1.user" + hash;
  CHECK(contains(compiled.out, "user functions " + hash));
  CHECK(contains(compiled.out, "compiled " + name));
  CHECK(contains(run_cli(cache, dir + " list").out, name));
  const json listed = json::parse(run_cli(cache, dir + " list --json").out);
  REQUIRE(listed.size() == 1);
  CHECK(listed[0].at("name") == name);
  CHECK(listed[0].at("user_functions") == hash);
  fs::path metadata = listed[0].at("path").get<std::string>();
  metadata.replace_extension(".json");
  std::ifstream in(metadata);
  CHECK(json::parse(in).at("user_functions") == hash);
  // Warm: the same sources find the entry.
  const Run again = run_cli(cache, dir + " precompile --variant " + name + " --score-mod " +
                                       sources.score_mod.string() + " --mask-mod " +
                                       sources.mask_mod.string());
  CHECK(again.status == 0);
  CHECK(contains(again.out, "cached   " + name));

  // A source NVRTC rejects: its log names the user's line, and the CLI the file.
  const Run broken = run_cli(cache, dir + " precompile --variant mma.sm80.bf16.d64.m64n64s1 "
                                          "--score-mod " + sources.broken.string());
  INFO(broken.err);
  CHECK(broken.status == 1);
  CHECK(contains(broken.err, "score_mod(3): error"));
  CHECK(contains(broken.err, "no_such_name"));
  CHECK(contains(broken.err, "score_mod = " + sources.broken.string()));
  CHECK(!contains(broken.err, "mask_mod ="));
}

TEST_CASE("precompile's user functions must match the variants named: --variant, --manifest, "
          "--family; errors name both hashes") {
  TempCache cache;
  const UserSources sources(cache.dir);
  const std::string dir = "--cache-dir " + cache.dir.string();
  const std::string mask = " --mask-mod " + sources.mask_mod.string();
  const std::string hash = flashjit::UserFunctions::from_files("", sources.mask_mod).hash();
  const std::string other = flashjit::UserFunctions::from_files(sources.score_mod, "").hash();
  auto fails = [&](const std::string& args) {
    const Run run = run_cli(cache, dir + " precompile " + args + " --dry-run");
    INFO(args, run.out);
    CHECK(run.status == 2);
    CHECK(run.out.empty());
    return run.err;
  };
  // --variant: a plain name gets the hash; a name with a hash needs those sources.
  const Run plain = run_cli(cache, dir + " precompile --variant mma.sm80.bf16.d64.m64n64s1 --dry-run" + mask);
  CHECK(plain.out == "mma.sm80.bf16.d64.m64n64s1.user" + hash + "\n");
  const std::string named = "mma.sm80.bf16.d64.m64n64s1.user" + hash;
  CHECK(run_cli(cache, dir + " precompile --dry-run --variant " + named + mask).out ==
        named + "\n");
  std::string err = fails("--variant " + named);
  CHECK(contains(err, "has user functions of hash " + hash));
  CHECK(contains(err, "--score-mod FILE and/or --mask-mod FILE"));
  err = fails("--variant " + named + " --score-mod " + sources.score_mod.string());
  CHECK(contains(err, "hash " + hash + ", but the sources given (--score-mod " +
                          sources.score_mod.string() + ") have hash " + other));
  err = fails("--variant simt.sm80.bf16.d64.m64n64s1" + mask);
  CHECK(contains(err, "family simt compiles no user functions"));
  err = fails("--arch sm_80 --family simt,mma" + mask);
  CHECK(contains(err, "--family simt: it compiles no user functions"));
  err = fails("--arch sm_80 --mask-mod " + (cache.dir / "missing.cu").string());
  CHECK(contains(err, "--mask-mod"));
  CHECK(contains(err, "missing.cu"));

  // --manifest: built as recorded; the sources make its hash buildable and must match it.
  const fs::path manifest = cache.dir / "recorded.txt";
  std::ofstream(manifest) << "mma.sm80.bf16.d64.m64n64s1\n" << named << "\n";
  const Run exact =
      run_cli(cache, dir + " precompile --dry-run --manifest " + manifest.string() + mask);
  INFO(exact.err);
  CHECK(exact.out == "mma.sm80.bf16.d64.m64n64s1\n" + named + "\n");
  const Run retargeted = run_cli(cache, dir + " precompile --dry-run --arch sm_86 --manifest " +
                                            manifest.string() + mask);
  CHECK(retargeted.out ==
        "mma.sm86.bf16.d64.m64n64s1\nmma.sm86.bf16.d64.m64n64s1.user" + hash + "\n");
  err = fails("--manifest " + manifest.string());
  CHECK(contains(err, manifest.string() + ": " + named + " has user functions of hash " + hash));
  err = fails("--manifest " + manifest.string() + " --score-mod " + sources.score_mod.string());
  CHECK(contains(err, "have hash " + other));
  const fs::path plain_manifest = cache.dir / "plain.txt";
  std::ofstream(plain_manifest) << "mma.sm80.bf16.d64.m64n64s1\n";
  err = fails("--manifest " + plain_manifest.string() + mask);
  CHECK(contains(err, "names no variant with user functions"));
  CHECK(json::parse(run_cli(cache, dir + " list --json").out).empty());
}

TEST_CASE("--version, and -q keeps a successful precompile silent") {
  TempCache cache;
  const Run version = run_cli(cache, "--version");
  CHECK(version.status == 0);
  CHECK(contains(version.out, fmt::format("flashjit {}", flashjit::version())));

  const Run quiet = run_cli(cache, "-q --cache-dir " + cache.dir.string() +
                                       " precompile --variant simt.sm80.fp16.d32.m64n64s1");
  CHECK(quiet.status == 0);
  CHECK(quiet.out.empty());
  CHECK(quiet.err.empty());
}

TEST_CASE("verify and bench run on the GPU, or fail saying there is none") {
  TempCache cache;
  const std::string dir = "--cache-dir " + cache.dir.string();
  const Run verify = run_cli(cache, dir +
                                        " verify --head-dim 64 --dtype bf16 --causal yes "
                                        "--batch 1 --heads 2 --seqlen 130 --seqlen-k 257");
  const Run bench = run_cli(cache, dir +
                                       " bench --head-dim 64 --causal no --seqlens 512 "
                                       "--warmup 1 --iters 3 --no-first-call");
  INFO("verify: ", verify.out, verify.err);
  INFO("bench: ", bench.out, bench.err);
  if (gpu_present()) {
    CHECK(verify.status == 0);
    CHECK(contains(verify.out, "1 passed"));
    CHECK(bench.status == 0);
    CHECK(contains(bench.out, "TFLOPS"));
  } else {
    for (const Run* run : {&verify, &bench}) {
      CHECK(run->status == 1);
      CHECK(contains(run->err, "runs on a GPU, and there is none here"));
      CHECK((contains(run->err, "no CUDA driver") || contains(run->err, "no CUDA device")));
    }
  }
}

TEST_CASE("operator edges: log level names, non-UTF-8 paths, lost output, sizes, which directory") {
  TempCache scratch;
  const std::string dir = "--cache-dir " + scratch.dir.string();
  // An unknown FLASHJIT_LOG_LEVEL is reported, not silently taken as "off".
  Run run = run_cli(scratch, dir + " info", "FLASHJIT_LOG_LEVEL=garbage");
  CHECK(run.status == 0);
  CHECK(contains(run.err, "FLASHJIT_LOG_LEVEL='garbage' is unknown"));
  // JSON stays JSON when a path is not UTF-8.
  const fs::path odd = scratch.dir / "cache-\xff\xfe";
  run = run_cli(scratch, fmt::format("--cache-dir '{}' info --json", odd.string()));
  CHECK(run.status == 0);
  CHECK_NOTHROW(json::parse(run.out));
  // Output that cannot be written is an error, not a silent success.
  run = run_cli(scratch, dir + " info >/dev/full");
  CHECK(run.status != 0);
  CHECK(contains(run.err, "cannot write the output"));
  // Sizes: no negative, no overflow.
  run = run_cli(scratch, dir + " prune --max-size -1");
  CHECK(run.status == 2);
  CHECK(contains(run.err, "'-1' is not a size"));
  run = run_cli(scratch, dir + " prune --max-size 20000000000000G");
  CHECK(run.status == 2);
  CHECK(contains(run.err, "more bytes than 64 bits"));
  // The error names the directory actually used and where it came from.
  const fs::path shared = scratch.dir / "shared";
  fs::create_directory(shared);
  fs::permissions(shared, fs::perms::all);
  run = run_cli(scratch, "clear", "FLASHJIT_CACHE_DIR=" + shared.string());
  CHECK(run.status != 0);
  CHECK(contains(run.err, shared.string()));
  CHECK(contains(run.err, "FLASHJIT_CACHE_DIR"));
  CHECK(contains(run.err, "writable by group or others"));
}

TEST_CASE("list shows every layer and which one each entry comes from") {
  TempCache scratch;
  const fs::path bundle = scratch.dir / "bundle", local = scratch.dir / "local";
  REQUIRE(run_cli(scratch, fmt::format("--cache-dir {} precompile --variant "
                                       "simt.sm80.bf16.d64.m64n64s1",
                                       bundle.string()))
              .status == 0);
  const std::string env = fmt::format("FLASHJIT_CACHE_PATH={}:{}", local.string(), bundle.string());
  Run run = run_cli(scratch, "list", env);
  REQUIRE(run.status == 0);
  CHECK(contains(run.out, fmt::format("layer 2: {} (read-only)", bundle.string())));
  CHECK(contains(run.out, fmt::format("layer 1: {} (writable)", local.string())));
  run = run_cli(scratch, "list --json", env);
  const json entries = json::parse(run.out);
  REQUIRE(entries.size() == 1);
  CHECK(entries[0].at("read_only") == true);
  CHECK(entries[0].at("layer") == bundle.string());
  CHECK(entries[0].at("state") == "current");
}

TEST_CASE(
    "precompile --out writes a bundle that a read-only layer serves; --manifest rebuilds it") {
  TempCache scratch;
  const fs::path bundle = scratch.dir / "bundle", fleet = scratch.dir / "fleet";
  Run run =
      run_cli(scratch, fmt::format("precompile --out {} --variant simt.sm80.bf16.d64.m64n64s1 "
                                   "--variant mma.sm80.bf16.d64.m64n64s1",
                                   bundle.string()));
  REQUIRE(run.status == 0);
  const fs::path manifest = bundle / "flashjit-manifest.txt";
  REQUIRE(fs::exists(manifest));
  const auto names = flashjit::read_variant_manifest(manifest);
  REQUIRE(names.size() == 2);
  CHECK(names[0].name() == "simt.sm80.bf16.d64.m64n64s1");
  // Served from the bundle as a read-only layer: nothing compiled, nothing written beside it.
  flashjit::KernelCache cache(flashjit::CacheOptions{scratch.dir / "local", {bundle}});
  const auto outcome = cache.compile(names[1]);
  CHECK(outcome.was_cached);
  CHECK(outcome.entry->read_only);
  // The manifest, retargeted to another arch, compiles exactly its variants there.
  run = run_cli(scratch, fmt::format("--cache-dir {} precompile --manifest {} --arch sm_86",
                                     fleet.string(), manifest.string()));
  REQUIRE(run.status == 0);
  const auto built = flashjit::KernelCache(flashjit::CacheOptions{fleet}).list();
  REQUIRE(built.size() == 2);
  for (const auto& entry : built) CHECK(entry.variant.arch == "sm_86");
  // A manifest naming something no family can build fails by file and line.
  std::ofstream(scratch.dir / "bad.txt")
      << "# recorded\nsimt.sm80.bf16.d64.m64n64s1\nsimt.sm80.bf16.d65.m64n64s1\n";
  run = run_cli(scratch, fmt::format("--cache-dir {} precompile --manifest {}", fleet.string(),
                                     (scratch.dir / "bad.txt").string()));
  CHECK(run.status != 0);
  CHECK(contains(run.err, "bad.txt line 3"));
}

TEST_CASE("the backward families: info marks them, precompile builds their defaults, list shows") {
  TempCache cache;
  const std::string dir = "--cache-dir " + cache.dir.string();
  std::vector<std::string> backward;
  for (const flashjit::FamilyInfo& family : flashjit::families())
    if (family.backward) backward.push_back(family.name);

  const Run info = run_cli(cache, dir + " info --json");
  REQUIRE(info.status == 0);
  const json doc = json::parse(info.out);
  REQUIRE(doc.at("families").size() == flashjit::families().size());
  for (std::size_t i = 0; i < flashjit::families().size(); ++i) {
    const json& family = doc.at("families")[i];
    INFO(family.at("name"));
    CHECK(family.at("backward") == flashjit::families()[i].backward);
    // Forward never runs a backward kernel, so none is an attention family.
    if (family.at("backward")) CHECK(family.at("attention") == false);
  }
  if (backward.empty()) {
    MESSAGE("no backward family is registered in this build: nothing more to check");
    return;
  }

  // The default set of the backward families alone, for Hopper: each family has variants there.
  const std::string families = fmt::format("{}", fmt::join(backward, ","));
  const Run dry =
      run_cli(cache, dir + " precompile --arch sm_90a --family " + families + " --dry-run");
  INFO(dry.out, dry.err);
  REQUIRE(dry.status == 0);
  std::string expected;
  for (const flashjit::Variant& v : flashjit::default_variants("sm_90a"))
    if (std::find(backward.begin(), backward.end(), v.family) != backward.end())
      expected += v.name() + "\n";
  CHECK(dry.out == expected);
  for (const std::string& family : backward) CHECK(contains(dry.out, family + ".sm90a."));

  // One slice of it compiled for real; list shows exactly those entries, by family too.
  const Run built = run_cli(cache, dir + " precompile --arch sm_90a --family " + families +
                                       " --head-dim 64 --dtype bf16 --causal no");
  INFO(built.out, built.err);
  REQUIRE(built.status == 0);
  CHECK(contains(built.out, "0 failed"));
  const json entries = json::parse(run_cli(cache, dir + " list --json").out);
  REQUIRE_FALSE(entries.empty());
  for (const json& entry : entries) {
    INFO(entry.at("name"));
    const std::string family = entry.at("family");
    CHECK(std::find(backward.begin(), backward.end(), family) != backward.end());
    CHECK(entry.at("state") == "current");
  }
  const Run table = run_cli(cache, dir + " list --family " + backward.front());
  REQUIRE(table.status == 0);
  CHECK(contains(table.out, backward.front() + ".sm90a.bf16.d64."));
}

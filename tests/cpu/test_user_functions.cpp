// User functions (UserFunctions, Variant::user_functions) with no GPU: their hash, the files they
// are read from, the .user<hash> suffix of variant names, NVRTC compiles of the examples
// (examples/user_functions) into each family that takes them, cached by content, and NVRTC errors
// that point at the user's own lines.
#include <doctest/doctest.h>
#include <fmt/format.h>

#include <algorithm>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <set>
#include <sstream>
#include <string>
#include <vector>

#include "families/block_mask/block_mask.hpp"
#include "families/registry.hpp"
#include "flashjit/flashjit.hpp"
#include "jit/kernel_store.hpp"
#include "temp_dir.hpp"
#include "user_examples.hpp"

using namespace flashjit;
using namespace flashjit::test;
namespace fs = std::filesystem;

namespace {

constexpr const char* kIdentityScore =
    "__device__ float score_mod(float score, int batch, int head, int q_idx, int kv_idx,\n"
    "                          const flashjit::UserArgs& args) {\n"
    "  return score;\n"
    "}\n";

bool is_hash(const std::string& text) {
  return text.size() == 32 && std::all_of(text.begin(), text.end(), [](char c) {
           return (c >= '0' && c <= '9') || (c >= 'a' && c <= 'f');
         });
}

std::string read_text(const fs::path& file) {
  std::ifstream in(file, std::ios::binary);
  return {std::istreambuf_iterator<char>(in), {}};
}

// The message of the Error(invalid_argument) that `call` throws.
template <typename Call>
std::string refusal(Call&& call) {
  try {
    call();
  } catch (const Error& e) {
    CHECK(e.code() == ErrorCode::invalid_argument);
    return e.what();
  }
  return "(accepted)";
}

// The first default variant of `family` for `arch` with head_dim 128.
Variant default_variant(const std::string& family, const std::string& arch) {
  for (const Variant& v : default_variants(arch))
    if (v.family == family && v.head_dim == 128) return v;
  FAIL(fmt::format("no default {} variant for {}", family, arch));
  return {};
}

// That variant with `functions` compiled in.
Variant user_variant(const std::string& family, const std::string& arch,
                     const UserFunctions& functions) {
  Variant v = default_variant(family, arch);
  v.user_functions = functions.hash();
  return v;
}

// The hashes of the three examples, one a line (what the cross-process check compares).
std::string example_hashes() {
  return fmt::format("{}\n{}\n{}\n", document_mask_functions().hash(),
                     relative_position_bias_functions().hash(), prefix_lm_functions().hash());
}

// Compiling `v` fails both ways a caller meets it, each message containing `text`:
// KernelCache::compile's outcome, and the Error(compile_failed) that forward gets from the store
// under it. Nothing is cached.
void check_compile_fails(const Variant& v, const std::string& text) {
  TempDir dir;
  KernelCache cache(CacheOptions{dir.path()});
  const CompileOutcome outcome = cache.compile(v);
  INFO(v.name(), ": ", outcome.error);
  CHECK_FALSE(outcome.ok);
  CHECK(outcome.error.find(text) != std::string::npos);
  detail::KernelStore store(CacheOptions{dir.path()});
  try {
    store.get(v, detail::kernel_spec(v));
    FAIL_CHECK("compiled");
  } catch (const Error& e) {
    CHECK(e.code() == ErrorCode::compile_failed);
    CHECK(std::string(e.what()).find(text) != std::string::npos);
  }
  CHECK(cache.list().empty());
}

constexpr const char* kHashOutVariable = "FLASHJIT_TEST_HASH_OUT";
constexpr const char* kHashTestCase =
    "user functions: the hashes of the examples for another process";

}  // namespace

TEST_CASE("user functions: the hash is 32 lowercase hex digits of both sources and their roles") {
  const UserFunctions a(kIdentityScore, ""), again(kIdentityScore, "");
  CHECK(is_hash(a.hash()));
  CHECK(a.hash() == again.hash());
  CHECK(a.has_score_mod());
  CHECK_FALSE(a.has_mask_mod());
  std::string changed = kIdentityScore;
  changed[changed.find("return score")] = 'R';  // one character
  CHECK(UserFunctions(changed, "").hash() != a.hash());
  // The same text as the other function, or moved across the boundary: another hash.
  CHECK(UserFunctions("", kIdentityScore).hash() != a.hash());
  CHECK(UserFunctions("ab", "c").hash() != UserFunctions("a", "bc").hash());
  const UserFunctions both(relative_position_bias_functions().score_mod(),
                           document_mask_functions().mask_mod());
  const UserFunctions swapped(both.mask_mod(), both.score_mod());
  CHECK(is_hash(both.hash()));
  CHECK(both.hash() != swapped.hash());
  CHECK(both.hash() != relative_position_bias_functions().hash());
  CHECK(both.hash() != document_mask_functions().hash());
}

TEST_CASE(kHashTestCase) {
  // Run in this suite as any test, and by the next one in a fresh process, which reads the file.
  const std::string hashes = example_hashes();
  std::istringstream lines(hashes);
  int count = 0;
  for (std::string line; std::getline(lines, line); ++count) CHECK(is_hash(line));
  CHECK(count == 3);
  if (const char* out = std::getenv(kHashOutVariable)) std::ofstream(out) << hashes;
}

TEST_CASE("user functions: another process hashes the same sources to the same hashes") {
  TempDir dir;
  const fs::path out = dir.path() / "hashes.txt";
  const std::string command =
      fmt::format("{}='{}' '{}' --test-case='{}' >'{}' 2>&1", kHashOutVariable, out.string(),
                  fs::read_symlink("/proc/self/exe").string(), kHashTestCase,
                  (dir.path() / "log.txt").string());
  const int status = std::system(command.c_str());
  INFO(read_text(dir.path() / "log.txt"));
  REQUIRE(status == 0);
  CHECK(read_text(out) == example_hashes());
}

TEST_CASE("user functions: both empty is refused; from_files names the file it cannot use") {
  CHECK(refusal([] { UserFunctions("", ""); }).find("both empty") != std::string::npos);
  CHECK(refusal([] { UserFunctions::from_files({}, {}); }).find("both empty") != std::string::npos);
  TempDir dir;
  const fs::path missing = dir.path() / "missing_mask.cu";
  const std::string not_read = refusal([&] { UserFunctions::from_files({}, missing); });
  CHECK(not_read.find(missing.string()) != std::string::npos);
  CHECK(not_read.find("mask_mod") != std::string::npos);
  const fs::path empty = dir.path() / "empty_score.cu";
  std::ofstream(empty).flush();
  const std::string empty_file = refusal([&] { UserFunctions::from_files(empty, {}); });
  CHECK(empty_file.find(empty.string()) != std::string::npos);
  CHECK(empty_file.find("score_mod") != std::string::npos);
  CHECK(refusal([&] { UserFunctions::from_files(dir.path(), {}); }).find(dir.path().string()) !=
        std::string::npos);  // a directory is no source file

  // The examples read as they are written.
  const UserFunctions documents = document_mask_functions();
  CHECK(documents.mask_mod() == read_text(user_example("document_mask.cu")));
  CHECK_FALSE(documents.has_score_mod());
  CHECK(documents.hash() == UserFunctions("", documents.mask_mod()).hash());
  const UserFunctions bias = relative_position_bias_functions();
  CHECK(bias.has_score_mod());
  CHECK_FALSE(bias.has_mask_mod());
}

TEST_CASE("variant names: .user<hash> comes last and parses back; bad hashes are named") {
  const UserFunctions functions = document_mask_functions();
  const std::string suffix = ".user" + functions.hash();
  for (const FamilyInfo& family : families()) {
    INFO(family.name);
    // The attention families with user-function hooks; simt (and merge) have none.
    const bool hooked = family.name == "wgmma" || family.name == "mma" || family.name == "decode" ||
                        family.name == "decode_tma";
    if (family.attention) CHECK(family.user_functions == hooked);
    CHECK(family.block_mask <= family.user_functions);  // a block mask is a mask_mod's
  }
  int named = 0;
  for (const char* arch : {"sm_80", "sm_90a"})
    for (const Variant& v : default_variants(arch)) {
      const FamilyInfo& info =
          *std::find_if(families().begin(), families().end(),
                        [&](const FamilyInfo& f) { return f.name == v.family; });
      if (!info.user_functions) continue;
      Variant with = v;
      with.user_functions = functions.hash();
      INFO(with.name());
      CHECK(with.name() == v.name() + suffix);
      CHECK(Variant::parse(with.name()) == with);
      with.softcap = info.softcap, with.window = info.window, with.sink = info.sink;
      with.alibi = info.alibi;
      CHECK(with.name().ends_with(suffix));
      CHECK(Variant::parse(with.name()) == with);
      ++named;
    }
  CHECK(named > 0);

  const std::string base = default_variant("wgmma", "sm_90a").name();
  auto parse_error = [](const std::string& name) { return refusal([&] { Variant::parse(name); }); };
  const std::string short_hash = parse_error(base + suffix.substr(0, suffix.size() - 1));
  CHECK(short_hash.find("user functions field") != std::string::npos);
  CHECK(short_hash.find("31 characters: expected 32 lowercase hex digits") != std::string::npos);
  std::string upper = functions.hash();
  std::transform(upper.begin(), upper.end(), upper.begin(), ::toupper);
  if (upper == functions.hash()) upper[0] = 'G';  // all digits: make it not hex another way
  CHECK(parse_error(base + ".user" + upper).find("is not 32 lowercase hex digits") !=
        std::string::npos);
  std::string not_hex = functions.hash();
  not_hex[5] = 'g';
  CHECK(parse_error(base + ".user" + not_hex).find("is not 32 lowercase hex digits") !=
        std::string::npos);
  // Not last, twice, or without a hash: a feature out of place.
  CHECK(parse_error(base + suffix + ".alibi").find("(in that order, each once)") !=
        std::string::npos);
  CHECK(parse_error(base + suffix + suffix).find("(in that order, each once)") !=
        std::string::npos);
  CHECK(parse_error(base + ".user").find("'user' is not one of") != std::string::npos);
  CHECK(parse_error("simt.sm90a.bf16.d128.m64n64s1" + suffix)
            .find("family simt has no variants with user functions") != std::string::npos);
}

TEST_CASE(
    "user variants compile with NVRTC for wgmma (sm_90a), mma (sm_80), decode and the "
    "block-mask builder, once") {
  TempDir dir;
  KernelCache cache(CacheOptions{dir.path()});
  const UserFunctions documents = document_mask_functions(), prefix = prefix_lm_functions(),
                      bias = relative_position_bias_functions();
  const UserFunctions both(bias.score_mod(), documents.mask_mod());
  const std::vector<const UserFunctions*> functions = {&documents, &prefix, &bias, &both};
  const std::pair<const char*, const char*> targets[] = {
      {"wgmma", "sm_90a"}, {"mma", "sm_80"}, {"decode", "sm_80"}, {"decode_tma", "sm_90a"}};
  std::vector<Variant> variants;
  for (const auto& [family, arch] : targets)
    for (const UserFunctions* f : functions) variants.push_back(user_variant(family, arch, *f));
  // After them, the builders of wgmma's block masks (Engine::create_block_mask) for each mask_mod.
  for (const UserFunctions* f : functions)
    if (f->has_mask_mod())
      variants.push_back(detail::block_mask_variant(user_variant("wgmma", "sm_90a", *f)));
  const std::vector<CompileOutcome> outcomes = cache.precompile(variants);
  for (const CompileOutcome& outcome : outcomes) {
    INFO(outcome.variant.name(), ": ", outcome.error);
    REQUIRE(outcome.ok);
    REQUIRE(outcome.entry.has_value());
    CHECK(outcome.entry->variant == outcome.variant);
    CHECK(outcome.entry->registers > 0);
  }
  MESSAGE(fmt::format("{} user variants compiled", outcomes.size()));
  for (std::size_t t = 0; t < std::size(targets); ++t) {
    const auto first = outcomes.begin() + static_cast<std::ptrdiff_t>(t * functions.size());
    // Other functions, other content keys and entries; other code, other cubins (the kernel
    // calls the functions: unused ones would leave no trace in it).
    std::set<std::string> keys, cubins;
    for (auto it = first; it != first + static_cast<std::ptrdiff_t>(functions.size()); ++it) {
      keys.insert(it->entry->key);
      cubins.insert(read_text(it->entry->cubin_path));
    }
    INFO(first->variant.name());
    CHECK(keys.size() == functions.size());
    CHECK(cubins.size() == functions.size());
  }
  for (const Variant& v : variants) {
    const CompileOutcome again = cache.compile(v);
    INFO(v.name(), ": ", again.error);
    CHECK(again.ok);
    CHECK(again.was_cached);
  }
  CHECK(cache.list().size() == variants.size());
  // A fresh store over the same directory serves them from disk.
  KernelCache reopened(CacheOptions{dir.path()});
  const CompileOutcome from_disk = reopened.compile(variants.front());
  CHECK(from_disk.ok);
  CHECK(from_disk.was_cached);
}

TEST_CASE("NVRTC errors in user code name the user's line: score_mod(3), mask_mod(2)") {
  const UserFunctions broken_score(
      "// line 1\n"
      "__device__ float score_mod(float score, int, int, int, int, const flashjit::UserArgs&) {\n"
      "  return score +;\n"
      "}\n",
      "");
  const UserFunctions broken_mask(
      "",
      "__device__ bool mask_mod(int, int, int, int, const flashjit::UserArgs&) {\n"
      "  return undeclared_name;\n"
      "}\n");
  for (const auto& [functions, line] :
       {std::pair{&broken_score, "score_mod(3)"}, std::pair{&broken_mask, "mask_mod(2)"}})
    check_compile_fails(user_variant("wgmma", "sm_90a", *functions), line);
}

TEST_CASE("a .user<hash> that no UserFunctions of this process has fails to compile, saying why") {
  // 32 hex digits that no source here hashes to (the examples' hashes are checked to differ).
  const std::string unknown = "0123456789abcdef0123456789abcdef";
  REQUIRE(example_hashes().find(unknown) == std::string::npos);
  const Variant v = Variant::parse(default_variant("wgmma", "sm_90a").name() + ".user" + unknown);
  CHECK(v.user_functions == unknown);
  check_compile_fails(v, unknown);
  check_compile_fails(v, "make a flashjit::UserFunctions");
}

TEST_CASE("a mask_mod's kernels carry an entry that reads a block mask; others have none") {
  // Kernels of the families that take block masks compile, for a mask_mod, a second entry
  // (BlockMask true) launched when a block mask is given, so the other runs exactly the code it
  // had before block masks. A score_mod alone, or no user functions, compiles one entry.
  TempDir dir;
  const UserFunctions documents = document_mask_functions(),
                      bias = relative_position_bias_functions();
  struct Case {
    Variant variant;
    bool block_mask_entry;
  };
  const std::vector<Case> cases = {
      {user_variant("mma", "sm_80", documents), true},
      {user_variant("bwd_mma_dq", "sm_80", documents), true},
      {user_variant("mma", "sm_80", bias), false},
      {default_variant("mma", "sm_80"), false},
      {user_variant("decode", "sm_80", documents), false},  // reads no block mask
  };
  for (const Case& c : cases) {
    INFO(c.variant.name());
    const detail::KernelSpec spec = detail::kernel_spec(c.variant);
    const auto compiled = detail::KernelStore(CacheOptions{dir.path()}).get(c.variant, spec);
    CHECK(compiled->block_mask_lowered_name.empty() != c.block_mask_entry);
    CHECK(compiled->block_mask_lowered_name != compiled->lowered_name);
    // The disk cache's record names it too: a second store reads it back.
    const auto reloaded = detail::KernelStore(CacheOptions{dir.path()}).get(c.variant, spec);
    CHECK(reloaded->cubin.size() == compiled->cubin.size());
    CHECK(reloaded->block_mask_lowered_name == compiled->block_mask_lowered_name);
  }
}

TEST_CASE("backward user variants compile for every dK/dV and dQ family, spilling at most 32 B") {
  // The examples in the backward's kernels: a mask_mod, and a score_mod with its derivative;
  // and the builders of the backward's block masks.
  TempDir dir;
  KernelCache cache(CacheOptions{dir.path()});
  const UserFunctions documents = document_mask_functions(),
                      bias = relative_position_bias_functions();
  REQUIRE(bias.has_score_mod_grad());
  const std::pair<const char*, const char*> targets[] = {{"bwd_wgmma_fused", "sm_90a"},
                                                         {"bwd_wgmma", "sm_90a"},
                                                         {"bwd_wgmma_dq", "sm_90a"},
                                                         {"bwd_mma", "sm_80"},
                                                         {"bwd_mma_dq", "sm_80"}};
  std::vector<Variant> variants;
  for (const auto& [family, arch] : targets)
    for (const UserFunctions* f : {&documents, &bias}) {
      variants.push_back(user_variant(family, arch, *f));
      // The mask_mod's kernels read a block mask when given one (BackwardOptions::block_mask),
      // causal ones included.
      if (f->has_mask_mod()) {
        Variant causal = user_variant(family, arch, *f);
        causal.causal = true;
        variants.push_back(causal);
      }
    }
  // The builders of a backward's block masks (Engine::create_backward_block_mask): the key-major
  // map at a dK/dV kernel's tiles, and the forward's kind at a dQ kernel's.
  for (const auto& [family, arch] : targets) {
    Variant causal = user_variant(family, arch, documents);
    causal.causal = true;
    variants.push_back(std::string(family).ends_with("_dq")
                           ? detail::block_mask_variant(causal)
                           : detail::backward_block_mask_variant(causal));
  }
  // ptxas keeps a register pair or two in local memory in some of these kernels' entries
  // (bwd_wgmma_fused's and bwd_mma_dq's d128 causal document mask without a block mask,
  // bwd_wgmma's with one): an STL.64 / LDL.64 a step. The entries without block masks compile to
  // the code they had before block masks existed, and the d128 backward without those spills
  // ran 22 % slower (docs/perf-log.md, session 19), so that much is allowed and no more.
  constexpr int kSpillAllowance = 32;  // bytes stored + loaded, the most of any entry
  for (const CompileOutcome& outcome : cache.precompile(variants)) {
    INFO(outcome.variant.name(), ": ", outcome.error);
    REQUIRE(outcome.ok);
    CHECK(outcome.entry->spill_bytes <= kSpillAllowance);
    MESSAGE(fmt::format("{}: {} registers, {} B spilled", outcome.variant.name(),
                        outcome.entry->registers, outcome.entry->spill_bytes));
  }
}

TEST_CASE("a backward kernel refuses a score_mod without score_mod_grad; its errors name its lines") {
  // Only a forward can run without the derivative: the backward's kernels say what is missing.
  const UserFunctions no_grad(kIdentityScore, "");
  CHECK_FALSE(no_grad.differentiable());
  check_compile_fails(user_variant("bwd_mma", "sm_80", no_grad), "needs its derivative");
  const UserFunctions broken_grad(
      kIdentityScore, "",
      "// line 1\n"
      "__device__ float score_mod_grad(float, int, int, int, int, const flashjit::UserArgs&) {\n"
      "  return missing_name;\n"
      "}\n");
  CHECK(broken_grad.differentiable());
  check_compile_fails(user_variant("wgmma", "sm_90a", broken_grad), "score_mod_grad(3)");
  // A derivative needs its score_mod; with one, it is part of the hash; without, the hash is the
  // one the functions had before derivatives existed.
  CHECK(refusal([] { UserFunctions("", "__device__ bool mask_mod();", "float g();"); })
            .find("score_mod_grad is given without a score_mod") != std::string::npos);
  CHECK(UserFunctions(kIdentityScore, "", "x").hash() != no_grad.hash());
  CHECK(UserFunctions(kIdentityScore, "", "").hash() == no_grad.hash());
}

// Engine::backward with user functions (BackwardOptions::user_functions) on the GPU, for every
// dK/dV family that runs here, against the float64 reference gradients: the examples of
// examples/user_functions as a user loads them (document masking, a relative-position bias with
// its derivative, prefix LM, whose mask reads the batch), a nonlinear per-head score_mod after
// soft-capping and ALiBi, a mask_mod that leaves rows and whole query tiles seeing no key (zero
// gradients), GQA, fp16, every Hopper head dim, the deterministic mode; a score_mod without its
// derivative is refused before anything runs.
#include <doctest/doctest.h>
#include <fmt/format.h>

#include <cmath>
#include <cstdint>
#include <random>
#include <string>
#include <vector>

#include "backward_case.hpp"
#include "flashjit/device_memory.hpp"
#include "gpu.hpp"
#include "serving_checks.hpp"  // all_poison
#include "user_examples.hpp"

using namespace flashjit;
using namespace flashjit::test;

namespace {

Engine& engine() { return shared_engine(); }

// A soft-cap of the user's own, one cap per query head from args.ptr[0]: nonlinear, so its
// derivative (1 - t²) matters, and after the built-in cap and ALiBi, so the order shows.
constexpr const char* kHeadCap =
    "__device__ float score_mod(float score, int batch, int head, int q_idx, int kv_idx,\n"
    "                           const flashjit::UserArgs& args) {\n"
    "  const float cap = static_cast<const float*>(args.ptr[0])[head];\n"
    "  return cap * tanhf(score / cap) + 0.0625f * (kv_idx % 3);\n"
    "}\n";
constexpr const char* kHeadCapGrad =
    "__device__ float score_mod_grad(float score, int batch, int head, int q_idx, int kv_idx,\n"
    "                                const flashjit::UserArgs& args) {\n"
    "  const float t = tanhf(score / static_cast<const float*>(args.ptr[0])[head]);\n"
    "  return 1.f - t * t;\n"
    "}\n";
// Every key hidden from the first 70 queries and from every fifth one; the first 40 keys from
// the rest.
constexpr const char* kHiding =
    "__device__ bool mask_mod(int batch, int head, int q_idx, int kv_idx,\n"
    "                         const flashjit::UserArgs& args) {\n"
    "  return q_idx >= 70 && q_idx % 5 != 0 && kv_idx >= 40;\n"
    "}\n";

const UserFunctions& documents() {
  static const UserFunctions functions = document_mask_functions();
  return functions;
}
const UserFunctions& bias() {
  static const UserFunctions functions = relative_position_bias_functions();
  return functions;
}
const UserFunctions& prefix() {
  static const UserFunctions functions = prefix_lm_functions();
  return functions;
}
const UserFunctions& capped_and_hidden() {
  static const UserFunctions functions(kHeadCap, kHiding, kHeadCapGrad);
  return functions;
}

// What one case's user functions read on the device (kept alive with the case).
struct UserCase {
  BackwardCase c;
  std::vector<DeviceBuffer> args;
};

UserCase with_documents(BackwardCase c, std::mt19937& rng) {
  const std::vector<std::int32_t> doc_id = random_documents(c.seqlen_k, 90, rng);
  UserCase u{c, {}};
  u.args.push_back(device_copy(engine(), doc_id));
  u.c.user_functions = &documents();
  u.c.user_args[0] = u.args[0].data();
  u.c.mask_mod = document_mask(doc_id);
  return u;
}

UserCase with_bias(BackwardCase c, std::mt19937& rng) {
  std::vector<float> table(
      static_cast<std::size_t>(c.heads_q * (2 * relative_position_range() + 1)));
  std::normal_distribution<float> normal(0.f, 1.f);
  for (float& x : table) x = normal(rng);
  UserCase u{c, {}};
  u.args.push_back(device_copy(engine(), table));
  u.c.user_functions = &bias();
  u.c.user_args[0] = u.args[0].data();
  u.c.score_mod = relative_position_bias(table);
  u.c.score_mod_grad = relative_position_bias_grad;
  return u;
}

UserCase with_prefix(BackwardCase c, std::mt19937& rng) {
  std::vector<std::int32_t> prefix_of;
  for (int b = 0; b < c.batch; ++b)
    prefix_of.push_back(static_cast<std::int32_t>(rng() % c.seqlen_k));
  UserCase u{c, {}};
  u.args.push_back(device_copy(engine(), prefix_of));
  u.c.user_functions = &prefix();
  u.c.user_args[0] = u.args[0].data();
  u.c.mask_mod = prefix_lm(prefix_of);
  return u;
}

UserCase with_capped_and_hidden(BackwardCase c) {
  std::vector<float> caps;
  for (int h = 0; h < c.heads_q; ++h) caps.push_back(1.5f + 0.5f * static_cast<float>(h % 4));
  UserCase u{c, {}};
  u.args.push_back(device_copy(engine(), caps));
  u.c.user_functions = &capped_and_hidden();
  u.c.user_args[0] = u.args[0].data();
  u.c.score_mod = [caps](double score, int, int head, int, int kv_idx) {
    const double cap = caps.at(static_cast<std::size_t>(head));
    return cap * std::tanh(score / cap) + 0.0625 * (kv_idx % 3);
  };
  u.c.score_mod_grad = [caps](double score, int, int head, int, int) {
    const double t = std::tanh(score / caps.at(static_cast<std::size_t>(head)));
    return 1 - t * t;
  };
  u.c.mask_mod = [](int, int, int q_idx, int kv_idx) {
    return q_idx >= 70 && q_idx % 5 != 0 && kv_idx >= 40;
  };
  return u;
}

// Each case in each dK/dV family here that has its head dim: within the bounds, the family's
// .user<hash> variant; the deterministic ones twice, bit for bit.
void check_cases(const std::vector<UserCase>& cases, unsigned seed) {
  const std::vector<std::string> families = backward_family_names();
  REQUIRE_MESSAGE(!families.empty(), "no backward dK/dV family runs here");
  for (const std::string& family : families)
    for (const UserCase& u : cases) {
      const BackwardCase& c = u.c;
      if (!family_has_head_dim(family, c.head_dim)) continue;
      if (c.deterministic && family == "bwd_wgmma_fused") continue;  // refused (CPU tests)
      CAPTURE(family);
      CAPTURE(c.describe());
      try {
        const BackwardCheck check = run_backward_case(engine(), c, family, seed);
        CAPTURE(check.variant);
        CHECK(check.variant.starts_with(family + "."));
        CHECK(check.variant.ends_with(".user" + c.user_functions->hash()));
        check_within_bounds(check, c.dtype);
        if (c.deterministic) {
          const BackwardProblem problem(engine(), c, seed);
          const BackwardOptions options = problem.options(family);
          problem.backward(options);
          synchronize(engine());
          const BackwardProblem::Gradients first = problem.gradients();
          problem.backward(options);
          synchronize(engine());
          const BackwardProblem::Gradients again = problem.gradients();
          CHECK_MESSAGE(again.dq.bits == first.dq.bits, "dq differs bitwise");
          CHECK_MESSAGE(again.dk.bits == first.dk.bits, "dk differs bitwise");
          CHECK_MESSAGE(again.dv.bits == first.dv.bits, "dv differs bitwise");
        }
        MESSAGE(fmt::format("{:<40} {:<50} {}", check.variant.substr(0, 40), c.describe(),
                            describe(check)));
      } catch (const Error& e) {
        FAIL_CHECK(std::string(e.what()));
      }
      ++seed;
    }
}

}  // namespace

TEST_CASE("backward with user functions: the examples, every head dim, causal or not, GQA") {
  std::mt19937 rng(9500);
  std::vector<UserCase> cases;
  for (int d : {64, 128, 256}) {
    cases.push_back(with_documents({1, 4, 2, 300, 300, d, true}, rng));
    cases.push_back(with_bias({2, 2, 1, 190, 260, d, false}, rng));
  }
  cases.push_back(with_documents({2, 2, 2, 260, 260, 128, false}, rng));
  cases.push_back(with_prefix({3, 4, 4, 200, 200, 128, false}, rng));
  cases.push_back(with_prefix({2, 2, 1, 150, 150, 64, false, DType::fp16}, rng));
  check_cases(cases, 9500);
}

TEST_CASE("backward with user functions: a nonlinear score_mod after softcap and ALiBi; empty rows") {
  std::vector<UserCase> cases;
  for (int d : {64, 128, 256})
    for (bool causal : {false, true}) {
      BackwardCase c{1, 4, 1, 230, 200, d, causal};  // sq > sk: causal rows before the first key
      c.softcap = 6.f;
      c.alibi = true;
      cases.push_back(with_capped_and_hidden(c));
    }
  BackwardCase window{1, 2, 2, 260, 260, 128, true};
  window.window_left = 60, window.window_right = 0;
  cases.push_back(with_capped_and_hidden(window));
  check_cases(cases, 9600);
}

TEST_CASE("backward with user functions: the deterministic mode repeats bitwise") {
  std::mt19937 rng(9700);
  std::vector<UserCase> cases;
  for (int d : {64, 128}) {
    BackwardCase c{1, 4, 2, 200, 200, d, true};
    c.deterministic = true;
    cases.push_back(with_documents(c, rng));
    BackwardCase capped{1, 2, 1, 150, 180, d, false};
    capped.deterministic = true;
    cases.push_back(with_capped_and_hidden(capped));
  }
  check_cases(cases, 9700);
}

TEST_CASE("backward with a score_mod but no score_mod_grad is refused; nothing is written") {
  const UserFunctions no_grad(kHeadCap, "");
  BackwardCase c{1, 2, 2, 64, 64, 64, false};
  std::vector<float> caps = {2.f, 3.f};
  const DeviceBuffer args = device_copy(engine(), caps);
  BackwardProblem problem(engine(), BackwardCase{c}, 9800);
  BackwardOptions options = problem.options();
  options.user_functions = &no_grad;
  options.user_args[0] = args.data();
  try {
    problem.backward(options);
    FAIL_CHECK("no error thrown");
  } catch (const Error& e) {
    CHECK(e.code() == ErrorCode::invalid_argument);
    CHECK(std::string(e.what()).find("score_mod_grad") != std::string::npos);
  }
  synchronize(engine());
  const BackwardProblem::Gradients g = problem.gradients();
  CHECK_MESSAGE(all_poison(g.dq), "dq was written");
  CHECK_MESSAGE(all_poison(g.dk), "dk was written");
  CHECK_MESSAGE(all_poison(g.dv), "dv was written");
}

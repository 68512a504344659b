// `flashjit verify`: forward passes on random data, checked against the float64 reference, over a
// default set of shapes (ragged lengths, GQA, seqlen_q != seqlen_k, one query, BHSD) or the one
// given, for each head dim, dtype and mask chosen.
#include <fmt/format.h>
#include <fmt/ranges.h>

#include <cmath>
#include <fstream>
#include <nlohmann/json.hpp>
#include <random>

#include "cli.hpp"
#include "compare.hpp"
#include "device_problem.hpp"
#include "flashjit/device_memory.hpp"
#include "options.hpp"
#include "progress.hpp"
#include "reference.hpp"

namespace flashjit::cli {
namespace {

using test::HostTensor;

struct Shape {
  int batch = 1, heads_q = 8, heads_kv = 8, seqlen_q = 1024, seqlen_k = 1024;
  bool bhsd = false;
};

struct VerifyOptions {
  int device = 0;
  std::vector<std::string> families;  // empty: the dispatcher's choice
  std::vector<std::string> dtypes;
  std::vector<int> head_dims;
  std::string causal = "both";
  std::optional<int> batch, heads, heads_kv, seqlen, seqlen_k;
  std::string layout;  // empty: each shape's own
  unsigned seed = 1;
  std::string json_path;
};

struct Case {
  Shape shape;
  int head_dim = 128;
  DType dtype = DType::bf16;
  bool causal = false;
  std::optional<std::string> family;

  std::string describe() const {
    return fmt::format("b{} hq{} hkv{} sq{} sk{} d{} {} {} {}", shape.batch, shape.heads_q,
                       shape.heads_kv, shape.seqlen_q, shape.seqlen_k, head_dim,
                       causal ? "causal" : "full", to_string(dtype), shape.bhsd ? "bhsd" : "bshd");
  }
};

// Errors against the float64 reference, with the bounds the GPU test suite uses (compare.hpp).
struct Result : test::ForwardErrors {
  enum class Status { passed, failed, skipped } status = Status::failed;
  std::string variant;
  std::string message;  // why it failed or was skipped
};

std::vector<Shape> default_shapes() {
  return {
      {2, 4, 2, 200, 200, false},  // GQA 2:1, lengths not a multiple of any tile
      {1, 2, 2, 77, 300, false},   // fewer queries than keys
      {1, 2, 1, 300, 77, false},   // more queries than keys: causal leaves rows with no key
      {1, 2, 2, 1, 513, false},    // one query, as in decoding
      {1, 2, 2, 640, 640, false},  // several whole tiles
      {2, 4, 2, 190, 211, true},   // BHSD layout
  };
}

std::vector<Shape> chosen_shapes(const VerifyOptions& o) {
  std::vector<Shape> shapes;
  if (o.batch || o.heads || o.heads_kv || o.seqlen || o.seqlen_k) {
    Shape shape;
    shape.batch = o.batch.value_or(shape.batch);
    shape.heads_q = o.heads.value_or(shape.heads_q);
    shape.heads_kv = o.heads_kv.value_or(shape.heads_q);
    shape.seqlen_q = o.seqlen.value_or(shape.seqlen_q);
    shape.seqlen_k = o.seqlen_k.value_or(shape.seqlen_q);
    if (shape.heads_q % shape.heads_kv != 0)
      throw Error(ErrorCode::invalid_argument, fmt::format("--heads-kv {} must divide --heads {}",
                                                           shape.heads_kv, shape.heads_q));
    shapes.push_back(shape);
  } else {
    shapes = default_shapes();
  }
  if (!o.layout.empty())
    for (Shape& shape : shapes) shape.bhsd = o.layout == "bhsd";
  return shapes;
}

std::vector<Case> chosen_cases(const VerifyOptions& o) {
  std::vector<std::optional<std::string>> families;
  for (const std::string& name : o.families) families.emplace_back(name);
  if (families.empty()) families.push_back(std::nullopt);
  std::vector<Case> cases;
  for (const auto& family : families)
    for (const Shape& shape : chosen_shapes(o))
      for (int head_dim : head_dims_or_all(o.head_dims))
        for (DType dtype : dtypes_or_all(o.dtypes))
          for (bool causal : yes_no_values(o.causal))
            cases.push_back({shape, head_dim, dtype, causal, family});
  return cases;
}

// Random inputs of one case, fresh per case, as host tensors in the case's layout.
HostTensor random_tensor(const Case& c, int seqlen, int heads, std::mt19937& rng) {
  HostTensor t = HostTensor::make(c.dtype, c.shape.batch, seqlen, heads, c.head_dim, c.shape.bhsd);
  t.fill_random(rng);
  return t;
}

Result compare(const Case& c, const HostTensor& out, const std::vector<float>& lse,
               const test::Reference& reference) {
  Result result;
  static_cast<test::ForwardErrors&>(result) = test::compare_forward(out, &lse, reference);
  result.message = test::describe_failures(result, c.dtype);
  result.status = result.message.empty() ? Result::Status::passed : Result::Status::failed;
  return result;
}

Result run_case(Engine& engine, const Case& c, unsigned seed) {
  std::mt19937 rng(seed);
  const Shape& s = c.shape;
  HostTensor q = random_tensor(c, s.seqlen_q, s.heads_q, rng);
  HostTensor k = random_tensor(c, s.seqlen_k, s.heads_kv, rng);
  HostTensor v = random_tensor(c, s.seqlen_k, s.heads_kv, rng);
  const test::DeviceProblem problem(engine, std::move(q), std::move(k), std::move(v));
  ForwardOptions options;
  options.causal = c.causal;
  options.family = c.family;
  options.lse = problem.lse();

  Result result;
  try {
    result.variant =
        engine.select_variant(problem.q(), problem.k(), problem.v(), problem.out(), options).name();
  } catch (const Error& e) {
    if (e.code() != ErrorCode::unsupported) throw;
    result.status = Result::Status::skipped;
    result.message = e.what();
    return result;
  }
  engine.forward(problem.q(), problem.k(), problem.v(), problem.out(), options);
  synchronize(engine);

  const double scale = 1.0 / std::sqrt(static_cast<double>(c.head_dim));
  const auto reference = test::reference_attention(problem.host_q(), problem.host_k(),
                                                   problem.host_v(), scale, c.causal);
  Result compared = compare(c, problem.output(), problem.lse_values(), reference);
  compared.variant = result.variant;
  return compared;
}

std::string result_line(const Case& c, const Result& r) {
  const std::string family = c.family ? fmt::format("{} ", *c.family) : std::string();
  switch (r.status) {
    case Result::Status::skipped:
      return fmt::format("skip  {}{}: {}", family, c.describe(), r.message);
    case Result::Status::passed:
    case Result::Status::failed:
      break;
  }
  std::string line = fmt::format(
      "{}  {:<40} {:<46} max_abs {:.2e} (tol {:.1e})  rel_l2 {:.2e}  lse {:.2e}",
      r.status == Result::Status::passed ? "ok  " : "FAIL", r.variant, c.describe(),
      r.max_abs_error, test::max_abs_tolerance(c.dtype, r.max_abs_reference), r.relative_l2_error,
      r.max_lse_error);
  if (!r.message.empty()) line += fmt::format("  <- {}", r.message);
  return line;
}

nlohmann::ordered_json result_json(const Case& c, const Result& r) {
  static constexpr const char* kStatus[] = {"passed", "failed", "skipped"};
  return {{"status", kStatus[static_cast<int>(r.status)]},
          {"variant", r.variant},
          {"family", c.family ? nlohmann::ordered_json(*c.family) : nullptr},
          {"batch", c.shape.batch},
          {"heads_q", c.shape.heads_q},
          {"heads_kv", c.shape.heads_kv},
          {"seqlen_q", c.shape.seqlen_q},
          {"seqlen_k", c.shape.seqlen_k},
          {"head_dim", c.head_dim},
          {"dtype", to_string(c.dtype)},
          {"causal", c.causal},
          {"layout", c.shape.bhsd ? "bhsd" : "bshd"},
          {"max_abs_error", r.max_abs_error},
          {"relative_l2_error", r.relative_l2_error},
          // JSON has no infinity: a non-finite LSE error (NaN, or a wrong -inf) is null.
          {"max_lse_error",
           std::isfinite(r.max_lse_error) ? nlohmann::ordered_json(r.max_lse_error) : nullptr},
          {"message", r.message}};
}

int run_verify(const VerifyOptions& options, const GlobalOptions& globals) {
  const std::vector<Case> cases = chosen_cases(options);
  const auto engine = open_engine("verify", options.device, open_cache(globals, false));
  const DeviceInfo& device = engine->device();
  if (!globals.quiet)
    fmt::print("verifying {} cases on GPU {} ({}, {}) against a float64 reference\n", cases.size(),
               device.ordinal, device.name, device.arch);

  ProgressBar progress("verifying", cases.size(), !globals.quiet && stdout_is_terminal());
  std::size_t passed = 0, failed = 0, skipped = 0;
  nlohmann::ordered_json report = nlohmann::ordered_json::array();
  for (std::size_t i = 0; i < cases.size(); ++i) {
    const Case& c = cases[i];
    Result result;
    bool device_lost = false;
    try {
      result = run_case(*engine, c, options.seed + static_cast<unsigned>(i));
    } catch (const Error& e) {
      result.status = Result::Status::failed;
      result.message = e.what();
      // After a failed driver call (e.g. an illegal address) the context is unusable.
      device_lost = e.code() == ErrorCode::cuda_error;
    }
    if (result.status == Result::Status::passed)
      ++passed;
    else if (result.status == Result::Status::failed)
      ++failed;
    else
      ++skipped;
    progress.advance(c.describe());
    if (!globals.quiet || result.status == Result::Status::failed)
      progress.print_line(result_line(c, result));
    report.push_back(result_json(c, result));
    if (device_lost) {
      progress.finish();
      fmt::print(stderr, "flashjit: error: stopping after a CUDA error; {} cases not run\n",
                 cases.size() - i - 1);
      break;
    }
  }
  progress.finish();
  if (!options.json_path.empty()) {
    std::ofstream file(options.json_path);
    file << report.dump(2, ' ', false, nlohmann::json::error_handler_t::replace) << '\n';
    if (!file)
      throw Error(ErrorCode::invalid_argument,
                  fmt::format("--json: cannot write {}", options.json_path));
  }
  if (!globals.quiet || failed > 0)
    fmt::print("{} cases: {} passed, {} failed, {} skipped\n", cases.size(), passed, failed,
               skipped);
  if (passed == 0 && failed == 0) {
    fmt::print(stderr, "flashjit: error: no case could run on this GPU (all skipped)\n");
    return 1;
  }
  return failed == 0 ? 0 : 1;
}

}  // namespace

void add_verify_command(CLI::App& app, const GlobalOptions& globals, int& status) {
  auto options = std::make_shared<VerifyOptions>();
  CLI::App* command = app.add_subcommand(
      "verify", "Check forward passes on the GPU against a float64 reference (needs a GPU)");
  add_device_option(*command, options->device);
  add_family_option(*command, options->families,
                    "Force these kernel families, each in turn (default: the dispatcher's "
                    "choice per case)");
  add_head_dim_option(*command, options->head_dims);
  add_dtype_option(*command, options->dtypes);
  add_causal_option(*command, options->causal);
  const std::string shape_group = "One shape instead of the default set";
  command->add_option("--batch", options->batch, "Batch size (default 1)")
      ->check(positive())
      ->group(shape_group)
      ->type_name("N");
  command->add_option("--heads", options->heads, "Query heads (default 8)")
      ->check(positive())
      ->group(shape_group)
      ->type_name("N");
  command
      ->add_option("--heads-kv", options->heads_kv,
                   "Key/value heads, dividing --heads (default: --heads)")
      ->check(positive())
      ->group(shape_group)
      ->type_name("N");
  command->add_option("--seqlen", options->seqlen, "Query length (default 1024)")
      ->check(positive())
      ->group(shape_group)
      ->type_name("N");
  command->add_option("--seqlen-k", options->seqlen_k, "Key length (default: --seqlen)")
      ->check(positive())
      ->group(shape_group)
      ->type_name("N");
  command
      ->add_option("--layout", options->layout,
                   "Memory layout of every case: bshd or bhsd (default: per shape)")
      ->check(CLI::IsMember({"bshd", "bhsd"}))
      ->type_name("LAYOUT");
  command->add_option("--seed", options->seed, "Seed of the random inputs")->default_str("1");
  command->add_option("--json", options->json_path, "Also write the results to FILE as JSON")
      ->type_name("FILE");
  command->callback([&globals, &status, options] { status = run_verify(*options, globals); });
}

}  // namespace flashjit::cli

// `flashjit bench`: forward throughput on the standard FlashAttention grid (batch x seqlen = 16k
// tokens, hidden 2048, heads = hidden / head_dim), as CUDA-event medians after warm-up, plus the
// latency of a first call split into cold compile, warm disk load and launch.
#include <fmt/format.h>
#include <fmt/ranges.h>
#include <stdlib.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <fstream>
#include <nlohmann/json.hpp>
#include <random>

#include "cli.hpp"
#include "flashjit/device_memory.hpp"
#include "options.hpp"
#include "progress.hpp"
#include "reference.hpp"
#include "table.hpp"

namespace flashjit::cli {
namespace {

// A cache directory of bench's own, removed afterwards: the cold compile is really cold and the
// user's cache is untouched.
class ScratchCacheDir {
 public:
  ScratchCacheDir() {
    std::string pattern =
        (std::filesystem::temp_directory_path() / "flashjit-bench-XXXXXX").string();
    if (::mkdtemp(pattern.data()) == nullptr)
      throw Error(ErrorCode::cache_error,
                  fmt::format("cannot create a directory from {}", pattern));
    path_ = pattern;
  }
  ~ScratchCacheDir() {
    std::error_code ignored;
    std::filesystem::remove_all(path_, ignored);
  }
  const std::filesystem::path& path() const { return path_; }

 private:
  std::filesystem::path path_;
};

struct BenchOptions {
  int device = 0;
  std::vector<std::string> families;  // empty: the dispatcher's choice
  std::vector<int> head_dims = {64, 128, 256};
  std::string causal = "both";
  std::vector<int> seqlens = {512, 1024, 2048, 4096, 8192, 16384};
  std::vector<std::string> dtypes = {"bf16"};
  int tokens = 16384;
  int hidden = 2048;
  int warmup = 5;
  int iterations = 20;
  bool skip_first_call = false;
  int host_calls = 10000;  // forward calls timed for the host overhead; 0 skips it
  std::string json_path;
};

struct BenchCase {
  std::optional<std::string> family;
  DType dtype = DType::bf16;
  bool causal = false;
  int head_dim = 128;
  int seqlen = 512;
  int batch = 1;
  int heads = 1;

  std::int64_t elements() const {
    return static_cast<std::int64_t>(batch) * seqlen * heads * head_dim;
  }
  // Matmul FLOPs of attention forward (QK^T and PV); the causal mask skips half.
  double flops() const {
    const double full = 4.0 * batch * heads * static_cast<double>(seqlen) * seqlen * head_dim;
    return causal ? full / 2 : full;
  }
  std::string describe() const {
    return fmt::format("{} d{} {} b{} h{} s{}", to_string(dtype), head_dim,
                       causal ? "causal" : "full", batch, heads, seqlen);
  }
};

struct Timing {
  std::string variant;
  std::string skipped;  // why the case did not run (its family cannot run it)
  std::string error;    // why it failed
  double median_ms = 0;
  double min_ms = 0;
  double tflops = 0;
};

struct FirstCall {
  std::string variant;
  std::string error;
  double compile_ms = 0;       // NVRTC with an empty cache, including the disk store
  double disk_load_ms = 0;     // a fresh process's lookup: read, verify, no NVRTC
  double first_launch_ms = 0;  // first forward on a fresh engine: module load + launch (host)
  double later_launch_ms = 0;  // a later forward: launch only (host)
};

std::vector<BenchCase> chosen_cases(const BenchOptions& o) {
  std::vector<std::optional<std::string>> families;
  for (const std::string& name : o.families) families.emplace_back(name);
  if (families.empty()) families.push_back(std::nullopt);
  std::vector<BenchCase> cases;
  for (const auto& family : families)
    for (DType dtype : dtypes_or_all(o.dtypes))
      for (bool causal : yes_no_values(o.causal))
        for (int head_dim : o.head_dims)
          for (int seqlen : o.seqlens) {
            BenchCase c{family, dtype, causal, head_dim, seqlen};
            c.batch = std::max(1, o.tokens / seqlen);
            c.heads = std::max(1, o.hidden / head_dim);
            cases.push_back(c);
          }
  return cases;
}

// Host time of one warm forward call: validation, lookups and the launch, not the kernel.
struct HostOverhead {
  std::string variant;
  std::string error;
  std::string problem;
  std::string stream;  // "default" (the legacy stream) or "created" (a stream of the engine's)
  int calls = 0;
  double p50_us = 0, p90_us = 0, p99_us = 0, mean_us = 0;
};

// q, k, v and out for every case: one allocation each, sized for the largest case.
class BenchInputs {
 public:
  BenchInputs(const Engine& engine, std::int64_t max_elements)
      : q_(engine, bytes(max_elements)),
        k_(engine, bytes(max_elements)),
        v_(engine, bytes(max_elements)),
        out_(engine, bytes(max_elements)) {}

  // Random normal values of `dtype`. A block is generated once and repeated through each buffer:
  // drawing 100M samples would take seconds, and the timing depends on the values only through
  // their range.
  void fill(DType dtype) {
    if (filled_ == dtype) return;
    constexpr std::size_t kBlock = std::size_t{1} << 20;
    unsigned seed = 1;
    for (DeviceBuffer* buffer : {&q_, &k_, &v_}) {
      std::mt19937 rng(seed++);
      std::normal_distribution<float> normal(0.f, 1.f);
      std::vector<std::uint16_t> block(kBlock);
      for (auto& x : block) x = test::from_float(dtype, normal(rng));
      for (std::size_t offset = 0; offset < buffer->size(); offset += kBlock * 2)
        buffer->upload(block.data(), std::min(kBlock * 2, buffer->size() - offset), offset);
    }
    filled_ = dtype;
  }

  TensorView q(const BenchCase& c) const { return view(q_, c); }
  TensorView k(const BenchCase& c) const { return view(k_, c); }
  TensorView v(const BenchCase& c) const { return view(v_, c); }
  TensorView out(const BenchCase& c) const { return view(out_, c); }

 private:
  static std::size_t bytes(std::int64_t elements) {
    return static_cast<std::size_t>(elements) * sizeof(std::uint16_t);
  }
  static TensorView view(const DeviceBuffer& buffer, const BenchCase& c) {
    return TensorView::bshd(buffer.data(), c.dtype, c.batch, c.seqlen, c.heads, c.head_dim);
  }

  DeviceBuffer q_, k_, v_, out_;
  std::optional<DType> filled_;
};

ForwardOptions forward_options(const BenchCase& c) {
  ForwardOptions options;
  options.causal = c.causal;
  options.family = c.family;
  return options;
}

// The variant forward would run, or nullopt (with `why`) when the forced family cannot.
std::optional<Variant> variant_for(const Engine& engine, const BenchInputs& in, const BenchCase& c,
                                   std::string& why) {
  try {
    return engine.select_variant(in.q(c), in.k(c), in.v(c), in.out(c), forward_options(c));
  } catch (const Error& e) {
    if (e.code() != ErrorCode::unsupported) throw;
    why = e.what();
    return std::nullopt;
  }
}

Timing time_case(Engine& engine, BenchInputs& in, const BenchCase& c, const BenchOptions& o) {
  Timing timing;
  in.fill(c.dtype);
  const auto variant = variant_for(engine, in, c, timing.skipped);
  if (!variant) return timing;
  timing.variant = variant->name();
  const ForwardOptions options = forward_options(c);
  auto forward = [&] { engine.forward(in.q(c), in.k(c), in.v(c), in.out(c), options); };
  for (int i = 0; i < o.warmup; ++i) forward();
  synchronize(engine);
  EventTimer timer(engine);
  std::vector<float> milliseconds;
  for (int i = 0; i < o.iterations; ++i) {
    timer.start();
    forward();
    milliseconds.push_back(timer.stop());
  }
  std::sort(milliseconds.begin(), milliseconds.end());
  const std::size_t middle = milliseconds.size() / 2;
  timing.median_ms = milliseconds.size() % 2 == 1
                         ? milliseconds[middle]
                         : (milliseconds[middle - 1] + milliseconds[middle]) / 2.0;
  timing.min_ms = milliseconds.front();
  timing.tflops = c.flops() / (timing.median_ms * 1e-3) / 1e12;
  return timing;
}

double milliseconds_since(std::chrono::steady_clock::time_point start) {
  return std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - start)
      .count();
}

FirstCall measure_first_call(int device, const BenchInputs& in, const BenchCase& c,
                             const Variant& variant) {
  FirstCall result;
  result.variant = variant.name();
  const ScratchCacheDir dir;
  {
    KernelCache cold(CacheOptions{dir.path()});
    const CompileOutcome compiled = cold.compile(variant);
    if (!compiled.ok) {
      result.error = compiled.error;
      return result;
    }
    result.compile_ms = compiled.milliseconds;
  }
  auto warm = std::make_shared<KernelCache>(CacheOptions{dir.path()});
  const CompileOutcome loaded = warm->compile(variant);
  if (!loaded.ok || !loaded.was_cached) {
    result.error = loaded.ok ? "the kernel just stored was not found on disk" : loaded.error;
    return result;
  }
  result.disk_load_ms = loaded.milliseconds;

  Engine fresh(device, warm);
  const ForwardOptions options = forward_options(c);
  auto start = std::chrono::steady_clock::now();
  fresh.forward(in.q(c), in.k(c), in.v(c), in.out(c), options);
  result.first_launch_ms = milliseconds_since(start);
  synchronize(fresh);
  start = std::chrono::steady_clock::now();
  fresh.forward(in.q(c), in.k(c), in.v(c), in.out(c), options);
  result.later_launch_ms = milliseconds_since(start);
  synchronize(fresh);
  return result;
}

// The small problem whose host overhead is measured: one 128-row query tile per head, so the GPU
// keeps up with the launches and the host time is what is measured.
BenchCase overhead_case(int head_dim) {
  BenchCase c;
  c.head_dim = head_dim;
  c.seqlen = 128;
  c.batch = 1;
  c.heads = 16;
  return c;
}

// p50/p90/p99 of the host time of `calls` back-to-back forward calls into one stream, with no
// synchronization between them. They go in bursts with an untimed synchronize between bursts, so
// the driver's launch queue never fills and no call waits for the GPU.
HostOverhead measure_host_overhead(Engine& engine, BenchInputs& in, const BenchCase& c, int calls,
                                   CUstream_st* stream) {
  HostOverhead result;
  result.problem = c.describe();
  result.stream = stream == nullptr ? "default" : "created";
  result.calls = calls;
  in.fill(c.dtype);
  const ForwardOptions options = forward_options(c);
  const TensorView q = in.q(c), k = in.k(c), v = in.v(c), out = in.out(c);
  result.variant = engine.select_variant(q, k, v, out, options).name();
  for (int i = 0; i < 10; ++i) engine.forward(q, k, v, out, options, stream);  // compile, load
  synchronize(engine);
  constexpr int kBurst = 128;
  std::vector<double> micros;
  micros.reserve(static_cast<std::size_t>(calls));
  for (int done = 0; done < calls; done += kBurst) {
    for (int i = 0; i < std::min(kBurst, calls - done); ++i) {
      const auto start = std::chrono::steady_clock::now();
      engine.forward(q, k, v, out, options, stream);
      micros.push_back(
          std::chrono::duration<double, std::micro>(std::chrono::steady_clock::now() - start)
              .count());
    }
    synchronize(engine);
  }
  double total = 0;
  for (double us : micros) total += us;
  result.mean_us = total / static_cast<double>(micros.size());
  std::sort(micros.begin(), micros.end());
  auto percentile = [&](double p) {
    return micros[std::min(micros.size() - 1, static_cast<std::size_t>(p * micros.size()))];
  };
  result.p50_us = percentile(0.50);
  result.p90_us = percentile(0.90);
  result.p99_us = percentile(0.99);
  return result;
}

void print_host_overheads(const std::vector<HostOverhead>& rows) {
  using Align = Table::Align;
  Table table({{"HOST TIME PER FORWARD (us)"},
               {"PROBLEM"},
               {"STREAM"},
               {"CALLS", Align::right},
               {"P50", Align::right},
               {"P90", Align::right},
               {"P99", Align::right},
               {"MEAN", Align::right}});
  for (const HostOverhead& row : rows) {
    if (!row.error.empty()) {
      table.add_row({row.variant, row.problem, row.stream, "failed", "", "", "", ""});
      continue;
    }
    table.add_row({row.variant, row.problem, row.stream, fmt::format("{}", row.calls),
                   fmt::format("{:.2f}", row.p50_us), fmt::format("{:.2f}", row.p90_us),
                   fmt::format("{:.2f}", row.p99_us), fmt::format("{:.2f}", row.mean_us)});
  }
  table.print();
  for (const HostOverhead& row : rows)
    if (!row.error.empty()) fmt::print(stderr, "host overhead of {}: {}\n", row.problem, row.error);
}

// Columns of timing_line.
std::string timing_header() {
  return fmt::format("{:<40} {:<30} {:>12} {:>15}", "VARIANT", "CASE", "MEDIAN", "THROUGHPUT");
}

std::string timing_line(const BenchCase& c, const Timing& t) {
  const std::string family = c.family ? fmt::format("{} ", *c.family) : std::string();
  if (!t.skipped.empty()) return fmt::format("skip  {}{}: {}", family, c.describe(), t.skipped);
  if (!t.error.empty()) return fmt::format("FAIL  {}{}: {}", family, c.describe(), t.error);
  return fmt::format("{:<40} {:<30} {:>9.3f} ms {:>8.1f} TFLOPS", t.variant, c.describe(),
                     t.median_ms, t.tflops);
}

void print_first_calls(const std::vector<FirstCall>& calls) {
  using Align = Table::Align;
  Table table({{"FIRST CALL (ms)"},
               {"COMPILE (COLD)", Align::right},
               {"DISK LOAD (WARM)", Align::right},
               {"FIRST LAUNCH", Align::right},
               {"LATER LAUNCH", Align::right}});
  for (const FirstCall& call : calls) {
    if (!call.error.empty()) {
      table.add_row({call.variant, "failed", "", "", ""});
      continue;
    }
    table.add_row({call.variant, fmt::format("{:.1f}", call.compile_ms),
                   fmt::format("{:.2f}", call.disk_load_ms),
                   fmt::format("{:.3f}", call.first_launch_ms),
                   fmt::format("{:.3f}", call.later_launch_ms)});
  }
  table.print();
  for (const FirstCall& call : calls)
    if (!call.error.empty()) fmt::print(stderr, "first call of {}: {}\n", call.variant, call.error);
}

nlohmann::ordered_json report_json(const BenchOptions& o, const DeviceInfo& device,
                                   const std::vector<BenchCase>& cases,
                                   const std::vector<Timing>& timings,
                                   const std::vector<FirstCall>& first_calls,
                                   const std::vector<HostOverhead>& host_overheads) {
  nlohmann::ordered_json results = nlohmann::ordered_json::array();
  for (std::size_t i = 0; i < timings.size(); ++i) {
    const BenchCase& c = cases[i];
    const Timing& t = timings[i];
    results.push_back({{"variant", t.variant},
                       {"family", c.family ? nlohmann::ordered_json(*c.family) : nullptr},
                       {"dtype", to_string(c.dtype)},
                       {"head_dim", c.head_dim},
                       {"causal", c.causal},
                       {"batch", c.batch},
                       {"heads", c.heads},
                       {"seqlen", c.seqlen},
                       {"median_ms", t.median_ms},
                       {"min_ms", t.min_ms},
                       {"tflops", t.tflops},
                       {"skipped", t.skipped},
                       {"error", t.error}});
  }
  nlohmann::ordered_json latency = nlohmann::ordered_json::array();
  for (const FirstCall& call : first_calls)
    latency.push_back({{"variant", call.variant},
                       {"compile_ms", call.compile_ms},
                       {"disk_load_ms", call.disk_load_ms},
                       {"first_launch_ms", call.first_launch_ms},
                       {"later_launch_ms", call.later_launch_ms},
                       {"error", call.error}});
  nlohmann::ordered_json overhead = nlohmann::ordered_json::array();
  for (const HostOverhead& row : host_overheads)
    overhead.push_back({{"variant", row.variant},
                        {"problem", row.problem},
                        {"stream", row.stream},
                        {"calls", row.calls},
                        {"p50_us", row.p50_us},
                        {"p90_us", row.p90_us},
                        {"p99_us", row.p99_us},
                        {"mean_us", row.mean_us},
                        {"error", row.error}});
  return {{"flashjit_version", version()},
          {"nvrtc_version", nvrtc_version()},
          {"driver_version", driver_version()},
          {"device",
           {{"name", device.name},
            {"arch", device.arch},
            {"compute_capability", fmt::format("{}.{}", device.cc_major, device.cc_minor)},
            {"multiprocessors", device.multiprocessors}}},
          {"settings",
           {{"tokens", o.tokens},
            {"hidden", o.hidden},
            {"warmup", o.warmup},
            {"iterations", o.iterations}}},
          {"results", results},
          {"first_call", latency},
          {"host_overhead", overhead}};
}

int run_bench(const BenchOptions& o, const GlobalOptions& globals) {
  const std::vector<BenchCase> cases = chosen_cases(o);
  const auto engine = open_engine("bench", o.device, open_cache(globals, false));
  const DeviceInfo& device = engine->device();
  std::int64_t max_elements = 0;
  for (const BenchCase& c : cases) max_elements = std::max(max_elements, c.elements());
  for (int head_dim : o.head_dims)
    max_elements = std::max(max_elements, overhead_case(head_dim).elements());
  BenchInputs inputs(*engine, max_elements);
  if (!globals.quiet)
    fmt::print(
        "bench on GPU {} ({}, {}, {} SMs): {} tokens per batch, hidden {}; median of {} "
        "runs after {} warm-up\n",
        device.ordinal, device.name, device.arch, device.multiprocessors, o.tokens, o.hidden,
        o.iterations, o.warmup);

  // Compile what the grid needs first, so no warm-up absorbs a compilation.
  std::vector<Variant> variants;
  std::vector<const BenchCase*> first_case_of;
  for (const BenchCase& c : cases) {
    std::string why;
    const auto variant = variant_for(*engine, inputs, c, why);
    if (variant && std::find(variants.begin(), variants.end(), *variant) == variants.end()) {
      variants.push_back(*variant);
      first_case_of.push_back(&c);
    }
  }
  std::size_t compile_failures = 0;
  for (const CompileOutcome& outcome : engine->cache().precompile(variants))
    if (!outcome.ok) {
      ++compile_failures;
      fmt::print(stderr, "flashjit: error: {} failed to compile:\n{}\n", outcome.variant.name(),
                 outcome.error);
    }

  std::vector<FirstCall> first_calls;
  if (!o.skip_first_call && compile_failures == 0) {
    ProgressBar progress("first calls", variants.size(), !globals.quiet && stdout_is_terminal());
    for (std::size_t i = 0; i < variants.size(); ++i) {
      inputs.fill(first_case_of[i]->dtype);
      try {
        first_calls.push_back(measure_first_call(o.device, inputs, *first_case_of[i], variants[i]));
      } catch (const Error& e) {
        first_calls.push_back({.variant = variants[i].name(), .error = e.what()});
      }
      progress.advance(variants[i].name());
    }
    progress.finish();
    print_first_calls(first_calls);
  }

  std::vector<HostOverhead> host_overheads;
  if (o.host_calls > 0 && compile_failures == 0) {
    const Stream created(*engine);
    for (CUstream_st* stream : {static_cast<CUstream_st*>(nullptr), created.get()})
      for (int head_dim : o.head_dims) {
        const BenchCase c = overhead_case(head_dim);
        try {
          host_overheads.push_back(measure_host_overhead(*engine, inputs, c, o.host_calls, stream));
        } catch (const Error& e) {
          HostOverhead failed;
          failed.problem = c.describe();
          failed.stream = stream == nullptr ? "default" : "created";
          failed.error = e.what();
          host_overheads.push_back(failed);
        }
      }
    print_host_overheads(host_overheads);
  }

  if (!globals.quiet) fmt::print("{}\n", timing_header());
  ProgressBar progress("timing", cases.size(), !globals.quiet && stdout_is_terminal());
  std::vector<Timing> timings;
  std::size_t failed = 0;
  for (const BenchCase& c : cases) {
    Timing timing;
    bool device_lost = false;
    try {
      timing = time_case(*engine, inputs, c, o);
    } catch (const Error& e) {
      timing.error = e.what();
      ++failed;
      // After a failed driver call (e.g. an illegal address) the context is unusable.
      device_lost = e.code() == ErrorCode::cuda_error;
    }
    timings.push_back(timing);
    progress.advance(c.describe());
    if (!globals.quiet || !timing.error.empty()) progress.print_line(timing_line(c, timing));
    if (device_lost) {
      progress.finish();
      fmt::print(stderr, "flashjit: error: stopping after a CUDA error; {} cases not run\n",
                 cases.size() - timings.size());
      break;
    }
  }
  progress.finish();
  if (!o.json_path.empty()) {
    std::ofstream file(o.json_path);
    file << report_json(o, device, cases, timings, first_calls, host_overheads)
                .dump(2, ' ', false, nlohmann::json::error_handler_t::replace)
         << '\n';
    if (!file)
      throw Error(ErrorCode::invalid_argument, fmt::format("--json: cannot write {}", o.json_path));
    if (!globals.quiet) fmt::print("results written to {}\n", o.json_path);
  }
  const bool any_ran = std::any_of(timings.begin(), timings.end(), [](const Timing& t) {
    return t.skipped.empty() && t.error.empty();
  });
  if (!any_ran && failed == 0) {
    fmt::print(stderr, "flashjit: error: no case could run on this GPU (all skipped)\n");
    return 1;
  }
  return failed == 0 && compile_failures == 0 ? 0 : 1;
}

}  // namespace

void add_bench_command(CLI::App& app, const GlobalOptions& globals, int& status) {
  auto options = std::make_shared<BenchOptions>();
  CLI::App* command = app.add_subcommand(
      "bench",
      "Time forward on the FlashAttention benchmark grid, and first-call latency "
      "(needs a GPU)");
  add_device_option(*command, options->device);
  add_family_option(*command, options->families,
                    "Force these kernel families, each in turn (default: the dispatcher's "
                    "choice)");
  command->add_option("--head-dim", options->head_dims, "Head dims")
      ->delimiter(',')
      ->check(CLI::IsMember(supported_head_dims()))
      ->default_str("64,128,256")
      ->type_name("D");
  add_causal_option(*command, options->causal);
  command->add_option("--seqlens", options->seqlens, "Sequence lengths (queries = keys)")
      ->delimiter(',')
      ->check(positive())
      ->default_str("512,1024,2048,4096,8192,16384")
      ->type_name("S");
  add_dtype_option(*command, options->dtypes, "Element types")->default_str("bf16");
  command->add_option("--tokens", options->tokens, "batch = tokens / seqlen (at least 1)")
      ->check(positive())
      ->default_str("16384")
      ->type_name("N");
  command->add_option("--hidden", options->hidden, "heads = hidden / head_dim (at least 1)")
      ->check(positive())
      ->default_str("2048")
      ->type_name("N");
  command->add_option("--warmup", options->warmup, "Untimed runs per case")
      ->check(non_negative())
      ->default_str("5")
      ->type_name("N");
  command->add_option("--iters", options->iterations, "Timed runs per case (the median is shown)")
      ->check(positive())
      ->default_str("20")
      ->type_name("N");
  command->add_flag("--no-first-call", options->skip_first_call,
                    "Skip the first-call latency measurement (one cold compile per variant)");
  command
      ->add_option("--host-calls", options->host_calls,
                   "Warm forward calls timed for the host overhead per head dim (0: skip)")
      ->check(non_negative())
      ->default_str("10000")
      ->type_name("N");
  command->add_option("--json", options->json_path, "Also write the results to FILE as JSON")
      ->type_name("FILE");
  command->callback([&globals, &status, options] { status = run_bench(*options, globals); });
}

}  // namespace flashjit::cli

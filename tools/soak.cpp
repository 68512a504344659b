// flashjit_soak: many forward calls of mixed shapes from several host threads on two streams, as
// a long-running server makes them. Prints host RSS and free device memory at the start (after
// one warm-up call per shape, which compiles and loads the kernels), the middle and the end, and
// exits non-zero on any error, any non-finite output, or memory that grows past a small bound.
//
//   flashjit_soak [--calls 10000] [--threads 4] [--streams 2]
#include <fmt/format.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cmath>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <memory>
#include <mutex>
#include <optional>
#include <random>
#include <string>
#include <thread>
#include <vector>

#include "flashjit/device_memory.hpp"
#include "flashjit/flashjit.hpp"
#include "reference.hpp"

using namespace flashjit;

namespace {

struct Shape {
  int batch, heads_q, heads_kv, seqlen_q, seqlen_k, head_dim;
  bool causal;
  DType dtype;
  bool bhsd;
  bool with_lse;
  std::optional<std::string> family;  // nullopt: the dispatcher's choice, as in production

  std::string describe() const {
    return fmt::format("b{} hq{} hkv{} sq{} sk{} d{} {} {} {}{} {}", batch, heads_q, heads_kv,
                       seqlen_q, seqlen_k, head_dim, causal ? "causal" : "full", to_string(dtype),
                       bhsd ? "bhsd" : "bshd", with_lse ? " lse" : "",
                       family ? *family : "default");
  }
  std::size_t q_elements() const { return std::size_t(batch) * seqlen_q * heads_q * head_dim; }
  std::size_t kv_elements() const { return std::size_t(batch) * seqlen_k * heads_kv * head_dim; }
};

// Every head dim, both dtypes and layouts, GQA and MQA, ragged and single-row sequences, causal
// with seqlen_q on either side of seqlen_k; the portable families forced on a few.
const std::vector<Shape> kShapes = {
    {1, 8, 8, 128, 128, 128, false, DType::bf16, false, true, {}},
    {2, 16, 2, 333, 333, 128, true, DType::bf16, false, true, {}},
    {4, 4, 1, 1, 1000, 64, true, DType::fp16, false, false, {}},
    {1, 8, 4, 513, 77, 64, true, DType::bf16, true, true, {}},
    {2, 4, 4, 200, 200, 32, false, DType::fp16, false, true, {}},
    {1, 6, 3, 190, 211, 96, true, DType::bf16, false, false, {}},
    {1, 4, 2, 300, 300, 192, false, DType::bf16, false, true, {}},
    {1, 4, 4, 100, 333, 256, false, DType::fp16, true, true, {}},
    {3, 2, 2, 65, 1, 128, true, DType::bf16, false, true, {}},
    {1, 12, 4, 1024, 1024, 128, true, DType::bf16, false, false, {}},
    {2, 4, 2, 150, 150, 128, false, DType::bf16, false, true, "simt"},
    {1, 8, 1, 257, 129, 64, true, DType::fp16, false, true, "mma"},
};

double host_rss_mib() {
  std::ifstream statm("/proc/self/statm");
  long pages = 0, resident = 0;
  statm >> pages >> resident;
  return double(resident) * double(sysconf(_SC_PAGESIZE)) / (1 << 20);
}

double device_free_mib(const Engine& engine) {
  return double(device_memory_info(engine).free_bytes) / (1 << 20);
}

struct Sample {
  const char* when;
  long calls;
  double rss_mib, device_free_mib;
};

// One host thread's buffers, large enough for every shape: inputs filled with N(0, 1), and a
// host copy of the output allocated up front, so the calls themselves allocate nothing big.
struct Buffers {
  Buffers(const Engine& engine, std::size_t q_elements, std::size_t kv_elements, std::size_t lse)
      : q(engine, q_elements * 2),
        k(engine, kv_elements * 2),
        v(engine, kv_elements * 2),
        out(engine, q_elements * 2),
        lse(engine, lse * 4),
        host_out(q_elements) {
    std::mt19937 rng(7);
    for (DeviceBuffer* buffer : {&q, &k, &v}) {
      test::HostTensor values =
          test::HostTensor::make(DType::bf16, 1, 1, 1, buffer->size() / 2, false);
      values.fill_random(
          rng);  // the bits are read as fp16 too: N(0, 1) bf16 patterns are finite there
      buffer->upload(values.bits.data(), buffer->size());
    }
  }
  DeviceBuffer q, k, v, out, lse;
  std::vector<std::uint16_t> host_out;
};

class Soak {
 public:
  Soak(Engine& engine, const std::vector<std::unique_ptr<Stream>>& streams)
      : engine_(engine), streams_(streams) {}

  // One call of `shape` on `stream` with `buffers`; every `check_every`-th call also waits for the
  // stream and checks that the output is finite.
  void forward(const Shape& shape, Buffers& buffers, const Stream& stream, bool check_output) {
    auto view = [&](const DeviceBuffer& buffer, int seqlen, int heads) {
      return shape.bhsd ? TensorView::bhsd(buffer.data(), shape.dtype, shape.batch, seqlen, heads,
                                           shape.head_dim)
                        : TensorView::bshd(buffer.data(), shape.dtype, shape.batch, seqlen, heads,
                                           shape.head_dim);
    };
    ForwardOptions options;
    options.causal = shape.causal;
    options.family = shape.family;
    options.lse = shape.with_lse ? static_cast<float*>(buffers.lse.data()) : nullptr;
    engine_.forward(view(buffers.q, shape.seqlen_q, shape.heads_q),
                    view(buffers.k, shape.seqlen_k, shape.heads_kv),
                    view(buffers.v, shape.seqlen_k, shape.heads_kv),
                    view(buffers.out, shape.seqlen_q, shape.heads_q), options, stream.get());
    if (!check_output) return;
    stream.synchronize();
    buffers.out.download(buffers.host_out.data(), shape.q_elements() * 2);
    for (std::size_t i = 0; i < shape.q_elements(); ++i)
      if (!std::isfinite(test::to_float(shape.dtype, buffers.host_out[i])))
        throw Error(ErrorCode::cuda_error,
                    fmt::format("non-finite output for {}", shape.describe()));
  }

  void record_error(const std::string& what) {
    std::lock_guard lock(mutex_);
    if (errors_++ < 5) fmt::print(stderr, "soak error: {}\n", what);
  }

  void run_thread(int thread, long calls, std::atomic<long>& done, Buffers& buffers) {
    std::mt19937 rng(1000 + thread);
    const Stream& stream = *streams_[thread % streams_.size()];
    for (long i = 0; i < calls; ++i) {
      const Shape& shape = kShapes[rng() % kShapes.size()];
      try {
        forward(shape, buffers, stream, i % 50 == 49 || i == calls - 1);
      } catch (const std::exception& e) {
        record_error(
            fmt::format("thread {} call {} ({}): {}", thread, i, shape.describe(), e.what()));
      }
      ++done;
    }
  }

  long errors() const { return errors_; }

 private:
  Engine& engine_;
  const std::vector<std::unique_ptr<Stream>>& streams_;
  std::mutex mutex_;
  long errors_ = 0;
};

long parse_flag(int argc, char** argv, const char* name, long fallback) {
  for (int i = 1; i + 1 < argc; ++i)
    if (std::strcmp(argv[i], name) == 0) return std::strtol(argv[i + 1], nullptr, 10);
  return fallback;
}

}  // namespace

int main(int argc, char** argv) {
  const long calls = parse_flag(argc, argv, "--calls", 10000);
  const int threads = static_cast<int>(parse_flag(argc, argv, "--threads", 4));
  const int stream_count = static_cast<int>(parse_flag(argc, argv, "--streams", 2));
  // Memory growth allowed. From the start (after warm-up) to the end: the worker threads' first
  // steps (malloc arenas, driver thread state). From the middle to the end, 5,000 calls in steady
  // state: a leak of a few hundred bytes per call would show.
  constexpr double kHostGrowthMib = 16, kSteadyHostGrowthMib = 2, kDeviceGrowthMib = 4;

  try {
    Engine engine(0);
    fmt::print("flashjit_soak on {} ({}): {} calls, {} threads, {} streams, {} shapes\n",
               engine.device().name, engine.device().arch, calls, threads, stream_count,
               kShapes.size());

    std::vector<std::unique_ptr<Stream>> streams;
    for (int i = 0; i < stream_count; ++i) streams.push_back(std::make_unique<Stream>(engine));
    std::size_t q_max = 0, kv_max = 0, lse_max = 0;
    for (const Shape& s : kShapes) {
      q_max = std::max(q_max, s.q_elements());
      kv_max = std::max(kv_max, s.kv_elements());
      lse_max = std::max(lse_max, std::size_t(s.batch) * s.heads_q * s.seqlen_q);
    }
    std::vector<std::unique_ptr<Buffers>> buffers;
    for (int t = 0; t < threads; ++t)
      buffers.push_back(std::make_unique<Buffers>(engine, q_max, kv_max, lse_max));

    std::vector<Sample> samples;
    samples.push_back({"before warm-up", 0, host_rss_mib(), device_free_mib(engine)});
    Soak soak(engine, streams);
    for (const Shape& shape : kShapes) {
      try {
        soak.forward(shape, *buffers[0], *streams[0], true);
      } catch (const std::exception& e) {
        soak.record_error(fmt::format("warm-up ({}): {}", shape.describe(), e.what()));
      }
    }
    samples.push_back({"start", 0, host_rss_mib(), device_free_mib(engine)});

    std::atomic<long> done{0};
    std::vector<std::thread> workers;
    const auto begin = std::chrono::steady_clock::now();
    for (int t = 0; t < threads; ++t)
      workers.emplace_back([&, t] {
        soak.run_thread(t, calls / threads + (t < calls % threads ? 1 : 0), done, *buffers[t]);
      });
    while (done < calls / 2) std::this_thread::sleep_for(std::chrono::milliseconds(1));
    samples.push_back({"middle", done.load(), host_rss_mib(), device_free_mib(engine)});
    for (auto& worker : workers) worker.join();
    synchronize(engine);
    const double seconds =
        std::chrono::duration<double>(std::chrono::steady_clock::now() - begin).count();
    samples.push_back({"end", done.load(), host_rss_mib(), device_free_mib(engine)});

    streams.clear();
    fmt::print("{:<15} {:>7} {:>14} {:>18}\n", "when", "calls", "host RSS MiB", "device free MiB");
    for (const Sample& s : samples)
      fmt::print("{:<15} {:>7} {:>14.1f} {:>18.1f}\n", s.when, s.calls, s.rss_mib,
                 s.device_free_mib);
    const Sample& start = samples[1];
    const Sample& middle = samples[2];
    const Sample& end = samples.back();
    const double host_growth = end.rss_mib - start.rss_mib;
    const double steady_host_growth = end.rss_mib - middle.rss_mib;
    const double device_growth = start.device_free_mib - end.device_free_mib;
    const bool ok = soak.errors() == 0 && end.calls == calls && host_growth <= kHostGrowthMib &&
                    steady_host_growth <= kSteadyHostGrowthMib && device_growth <= kDeviceGrowthMib;
    fmt::print(
        "soak {}: {} forward calls in {:.1f} s, {} errors; host RSS {:+.1f} MiB from the "
        "start (bound {}), {:+.1f} MiB from the middle (bound {}); device memory {:+.1f} MiB "
        "used (bound {})\n",
        ok ? "PASSED" : "FAILED", end.calls, seconds, soak.errors(), host_growth, kHostGrowthMib,
        steady_host_growth, kSteadyHostGrowthMib, device_growth, kDeviceGrowthMib);
    return ok ? 0 : 1;
  } catch (const std::exception& e) {
    fmt::print(stderr, "soak FAILED: {}\n", e.what());
    return 1;
  }
}

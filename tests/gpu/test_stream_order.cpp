// Stream order under programmatic dependent launch: from sm_90 on every kernel may be scheduled
// while the stream's previous kernel is still running (common/grid_dependency.cuh), so these
// tests chain calls whose inputs are the previous call's outputs, and queue calls that share the
// engine's workspace, without synchronizing between them, and compare with the same calls made
// one at a time.
#include <doctest/doctest.h>
#include <fmt/format.h>

#include <cmath>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "backward_case.hpp"
#include "flashjit/device_memory.hpp"
#include "forward_case.hpp"
#include "gpu.hpp"

using namespace flashjit;
using namespace flashjit::test;

namespace {

Engine& engine() { return shared_engine(); }

constexpr int kLinks = 6;  // forwards in a chain

// A chain of forwards: link i + 1 = attention(link i, k, v). Link 0 is the problem's q; the
// others start poisoned (NaN), so a forward that read its q before the previous one had written
// it shows.
class ForwardChain {
 public:
  ForwardChain(const DeviceProblem& problem, const HostTensor& q)
      : problem_(problem), q_(q) {
    for (int i = 0; i <= kLinks; ++i) links_.emplace_back(engine(), q.bytes());
    links_[0].upload(q.bits.data(), q.bytes());
  }

  // Runs the chain on `stream`, synchronizing after every forward or only at the end; returns
  // every link's bits.
  std::vector<std::vector<std::uint16_t>> run(const ForwardOptions& options, const Stream& stream,
                                              bool synchronize_each) {
    for (int i = 1; i <= kLinks; ++i) links_[i].fill_bytes(0xff);
    for (int i = 0; i < kLinks; ++i) {
      engine().forward(link(i), problem_.k(), problem_.v(), link(i + 1), options, stream.get());
      if (synchronize_each) stream.synchronize();
    }
    stream.synchronize();
    std::vector<std::vector<std::uint16_t>> bits;
    for (const DeviceBuffer& buffer : links_) {
      bits.emplace_back(q_.bits.size());
      buffer.download(bits.back().data(), q_.bytes());
    }
    return bits;
  }

 private:
  TensorView link(int i) const {
    TensorView view = q_.view;
    view.data = links_[i].data();
    return view;
  }

  const DeviceProblem& problem_;
  const HostTensor& q_;
  std::vector<DeviceBuffer> links_;
};

void check_chain(const ForwardCase& c, std::optional<std::string> family, int num_splits,
                 unsigned seed) {
  CAPTURE(c.describe());
  CAPTURE(family.value_or("dispatcher's"));
  const DeviceProblem problem = random_problem(engine(), c, seed);
  ForwardOptions options;
  options.causal = c.causal;
  options.family = family;
  options.num_splits = num_splits;
  const Stream stream(engine());
  ForwardChain chain(problem, problem.host_q());
  try {
    const auto one_by_one = chain.run(options, stream, true);
    const auto chained = chain.run(options, stream, false);
    for (int i = 1; i <= kLinks; ++i) {
      INFO("link ", i);
      CHECK_MESSAGE(chained[i] == one_by_one[i], "the chained forward's output differs");
    }
    // Not a chain of NaNs that happen to agree: the last link is finite.
    bool finite = true;
    for (std::uint16_t b : one_by_one[kLinks]) finite = finite && std::isfinite(to_float(c.dtype, b));
    CHECK_MESSAGE(finite, "the chain's last output holds NaN or inf");
    MESSAGE(fmt::format("{} chained forwards ({}): bitwise equal to one-at-a-time calls", kLinks,
                        c.describe()));
  } catch (const Error& e) {
    if (e.code() != ErrorCode::unsupported) throw;
    MESSAGE(fmt::format("{} does not run {}: {}", family.value_or("dispatcher"), c.describe(),
                        e.what()));
  }
}

}  // namespace

TEST_CASE("forwards chained on one stream read each previous forward's output") {
  unsigned seed = 4100;
  const ForwardCase prefill{2, 4, 4, 384, 384, 128, true};
  for (const std::string& family : family_names()) check_chain(prefill, family, 0, seed++);
  // Split keys: a decode kernel and the merge a call, the partials in the engine's workspace,
  // which every call of the chain reuses.
  const ForwardCase decode{4, 8, 2, 1, 4096, 128, false};
  check_chain(decode, std::nullopt, 8, seed++);
}

TEST_CASE("backwards queued on one stream share the engine's workspace safely") {
  unsigned seed = 4200;
  const Stream stream(engine());
  for (const std::string& family : backward_family_names())
    for (bool deterministic : {false, true}) {
      if (deterministic && family == "bwd_wgmma_fused") continue;  // refused (CPU tests)
      BackwardCase c{2, 4, 2, 384, 384, 128, true};
      c.deterministic = deterministic;
      CAPTURE(family);
      CAPTURE(c.describe());
      std::vector<std::unique_ptr<BackwardProblem>> problems;
      for (int i = 0; i < 4; ++i)
        problems.push_back(std::make_unique<BackwardProblem>(engine(), c, seed++));
      std::vector<BackwardProblem::Gradients> alone;
      for (const auto& problem : problems) {
        problem->backward(problem->options(family), stream.get());
        stream.synchronize();
        alone.push_back(problem->gradients());
      }
      for (const auto& problem : problems) problem->poison();
      for (const auto& problem : problems)
        problem->backward(problem->options(family), stream.get());
      stream.synchronize();
      for (std::size_t i = 0; i < problems.size(); ++i) {
        INFO("problem ", i);
        const BackwardProblem::Gradients queued = problems[i]->gradients();
        check_within_bounds(problems[i]->compare(queued), c.dtype);
        CHECK_MESSAGE(queued.dk.bits == alone[i].dk.bits, "dk differs from the call alone");
        CHECK_MESSAGE(queued.dv.bits == alone[i].dv.bits, "dv differs from the call alone");
        // The default mode sums dQ by atomics in some families: bitwise only when deterministic.
        if (deterministic)
          CHECK_MESSAGE(queued.dq.bits == alone[i].dq.bits, "dq differs from the call alone");
      }
      MESSAGE(fmt::format("{}: 4 queued backwards ({}{}) match one-at-a-time calls", family,
                          c.describe(), deterministic ? ", deterministic" : ""));
    }
}

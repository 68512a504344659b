// CUDA graph capture for the GPU tests, straight from libcuda: the library has no graph API and
// the tests link no CUDA runtime, so the few driver calls are dlopen'd here (prototypes declared
// locally with opaque handles). What a serving loop does: capture warm forwards once, replay them.
#pragma once

#include <functional>

#include "flashjit/flashjit.hpp"

namespace flashjit::test {

class CudaGraph {
 public:
  // Captures what `enqueue` puts on `stream` (in `context`) into a graph and instantiates it. The
  // capture is global-mode (CU_STREAM_CAPTURE_MODE_GLOBAL): an allocation, a synchronization or a
  // copy on the legacy stream inside `enqueue` fails it. Throws std::runtime_error naming the
  // driver call that failed; rethrows what `enqueue` throws, after ending the capture.
  CudaGraph(CUctx_st* context, CUstream_st* stream, const std::function<void()>& enqueue);
  ~CudaGraph();
  CudaGraph(const CudaGraph&) = delete;
  CudaGraph& operator=(const CudaGraph&) = delete;

  // Enqueues one replay of the whole graph on `stream`.
  void launch(CUstream_st* stream) const;

 private:
  CUctx_st* context_ = nullptr;
  void* graph_ = nullptr;  // CUgraph
  void* exec_ = nullptr;   // CUgraphExec
};

}  // namespace flashjit::test

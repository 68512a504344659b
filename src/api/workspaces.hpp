// The engine's own split-KV scratch (and tile counters): one device buffer per (context, stream),
// grown on the call that first needs more and reused in stream order after that, so warm
// forwards never allocate.
// A buffer that grows is kept until the engine goes (earlier launches may still read it); the
// engine's teardown waits for the launches in flight before it frees them.
#pragma once

#include <cuda.h>

#include <cstddef>
#include <map>
#include <mutex>
#include <utility>
#include <vector>

namespace flashjit::detail {

class Workspaces {
 public:
  // `what` names the buffers in logs and allocation errors, e.g. "split-KV workspace".
  explicit Workspaces(const char* what) : what_(what) {}
  ~Workspaces();
  Workspaces(const Workspaces&) = delete;
  Workspaces& operator=(const Workspaces&) = delete;

  // At least `bytes` of device memory for launches on `stream` in `context` (current on the
  // calling thread). Throws Error(cuda_error) when the allocation fails.
  void* get(CUcontext context, CUstream stream, std::size_t bytes);
  // The same, its bytes zeroed (in stream order) when allocated, for state that launches on the
  // stream share one after the other (the wgmma kernels' tile counters, which each launch leaves
  // zero again). nullptr, for no such sharing, where launches on the stream may overlap: while it
  // captures a CUDA graph (which may be replayed on any stream, even alongside itself) and for
  // the per-thread default stream (one handle, a stream per thread).
  void* get_stream_ordered(CUcontext context, CUstream stream, std::size_t bytes);

 private:
  struct Buffer {
    CUcontext context = nullptr;
    CUdeviceptr address = 0;
    std::size_t bytes = 0;
  };
  void* grow(Buffer& buffer, CUcontext context, CUstream stream, std::size_t bytes);

  const char* what_;
  std::mutex mutex_;
  std::map<std::pair<CUcontext, CUstream>, Buffer> buffers_;
  std::vector<Buffer> retired_;
};

}  // namespace flashjit::detail

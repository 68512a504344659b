#include "cuda_graph.hpp"

#include <dlfcn.h>

#include <stdexcept>
#include <string>

namespace flashjit::test {
namespace {

// cuda.h's ABI: CUresult is an int-sized enum, handles are pointers, and the names below are the
// symbols its macros map to (cuStreamBeginCapture -> _v2, cuGraphInstantiate -> WithFlags).
using CUresult = int;
constexpr CUresult kSuccess = 0;
constexpr int kCaptureModeGlobal = 0;  // CU_STREAM_CAPTURE_MODE_GLOBAL

struct GraphDriver {
  CUresult (*cuGetErrorName)(CUresult, const char**) = nullptr;
  CUresult (*cuCtxPushCurrent_v2)(CUctx_st*) = nullptr;
  CUresult (*cuCtxPopCurrent_v2)(CUctx_st**) = nullptr;
  CUresult (*cuStreamBeginCapture_v2)(CUstream_st*, int) = nullptr;
  CUresult (*cuStreamEndCapture)(CUstream_st*, void**) = nullptr;
  CUresult (*cuGraphInstantiateWithFlags)(void**, void*, unsigned long long) = nullptr;
  CUresult (*cuGraphLaunch)(void*, CUstream_st*) = nullptr;
  CUresult (*cuGraphExecDestroy)(void*) = nullptr;
  CUresult (*cuGraphDestroy)(void*) = nullptr;
};

template <typename Function>
void load(void* library, Function& function, const char* name) {
  function = reinterpret_cast<Function>(::dlsym(library, name));
  if (function == nullptr) throw std::runtime_error(std::string("libcuda.so.1 has no ") + name);
}

const GraphDriver& driver() {
  static const GraphDriver table = [] {
    // The engine already loaded and initialized the driver: this finds the same copy.
    void* library = ::dlopen("libcuda.so.1", RTLD_NOW | RTLD_LOCAL);
    if (library == nullptr) throw std::runtime_error(std::string("dlopen: ") + ::dlerror());
    GraphDriver d;
    load(library, d.cuGetErrorName, "cuGetErrorName");
    load(library, d.cuCtxPushCurrent_v2, "cuCtxPushCurrent_v2");
    load(library, d.cuCtxPopCurrent_v2, "cuCtxPopCurrent_v2");
    load(library, d.cuStreamBeginCapture_v2, "cuStreamBeginCapture_v2");
    load(library, d.cuStreamEndCapture, "cuStreamEndCapture");
    load(library, d.cuGraphInstantiateWithFlags, "cuGraphInstantiateWithFlags");
    load(library, d.cuGraphLaunch, "cuGraphLaunch");
    load(library, d.cuGraphExecDestroy, "cuGraphExecDestroy");
    load(library, d.cuGraphDestroy, "cuGraphDestroy");
    return d;
  }();
  return table;
}

void check(CUresult result, const char* call) {
  if (result == kSuccess) return;
  const char* name = nullptr;
  if (driver().cuGetErrorName(result, &name) != kSuccess || name == nullptr) name = "?";
  throw std::runtime_error(std::string(call) + " failed: " + name + " (" + std::to_string(result) +
                           ")");
}

// The engine's context current on this thread for the scope.
class CurrentContext {
 public:
  explicit CurrentContext(CUctx_st* context) {
    check(driver().cuCtxPushCurrent_v2(context), "cuCtxPushCurrent");
  }
  ~CurrentContext() {
    CUctx_st* popped = nullptr;
    driver().cuCtxPopCurrent_v2(&popped);
  }
  CurrentContext(const CurrentContext&) = delete;
  CurrentContext& operator=(const CurrentContext&) = delete;
};

}  // namespace

CudaGraph::CudaGraph(CUctx_st* context, CUstream_st* stream, const std::function<void()>& enqueue)
    : context_(context) {
  CurrentContext current(context_);
  check(driver().cuStreamBeginCapture_v2(stream, kCaptureModeGlobal), "cuStreamBeginCapture");
  try {
    enqueue();
  } catch (...) {
    void* abandoned = nullptr;
    driver().cuStreamEndCapture(stream, &abandoned);  // leaves the stream usable
    if (abandoned != nullptr) driver().cuGraphDestroy(abandoned);
    throw;
  }
  check(driver().cuStreamEndCapture(stream, &graph_), "cuStreamEndCapture");
  if (graph_ == nullptr) throw std::runtime_error("cuStreamEndCapture returned no graph");
  try {
    check(driver().cuGraphInstantiateWithFlags(&exec_, graph_, 0), "cuGraphInstantiate");
  } catch (...) {
    driver().cuGraphDestroy(graph_);
    throw;
  }
}

CudaGraph::~CudaGraph() {
  try {
    CurrentContext current(context_);
    if (exec_ != nullptr) driver().cuGraphExecDestroy(exec_);
    if (graph_ != nullptr) driver().cuGraphDestroy(graph_);
  } catch (...) {
    // The context is gone (process teardown); so are its graphs.
  }
}

void CudaGraph::launch(CUstream_st* stream) const {
  CurrentContext current(context_);
  check(driver().cuGraphLaunch(exec_, stream), "cuGraphLaunch");
}

}  // namespace flashjit::test

// What the serving GPU tests (test_decode.cpp, test_varlen.cpp) share: which decode kernels run
// each case, whether the decode family has a head dim on this GPU, the reference check, the poison
// checks and the checks that a call is refused.
#pragma once

#include <functional>
#include <optional>
#include <string>
#include <vector>

#include "reference.hpp"
#include "varlen_problem.hpp"

namespace flashjit::test {

// The decode family's d256 tile needs more shared memory than the 99 KB a block gets on sm_86,
// sm_89 and sm_120 parts (there dense d256 decodes fall back to mma): d256 is expected of it only
// where a block may have 160 KB (A100, H100/H200, B200).
bool decode_has_head_dim(int head_dim);

// The prefill family the dispatcher gives a problem over a paged cache at a decode head dim (64,
// 128, 256) with more than 64 query rows per KV head, unsplit: wgmma on Hopper (pages of any
// multiple of 8 rows: TMA runs or gathered rows), mma elsewhere (rows looked up one by one); ""
// where the decode kernels keep it.
std::string paged_prefill_family(int head_dim, int page_size, long long rows_per_kv_head,
                                 int num_splits);

// The decode kernels to run each case with: the dispatcher's (TMA loads on Hopper), and the
// cp.async one forced, which Hopper would otherwise never run.
std::vector<std::optional<std::string>> decode_kernels();

// Every element still holds the NaN poison (PoisonedOutput).
bool all_poison(const HostTensor& out);
bool all_poison(const std::vector<float>& lse);

// Output and LSE within the bounds the forward tests use (compare.hpp; a row that sees no key
// must have LSE exactly -inf), and each such row exactly 0. Returns how many rows see no key.
int check_against(const HostTensor& out, const std::vector<float>& lse, const Reference& ref,
                  DType dtype);

// A varlen forward's output and LSE (in the packed layouts): each sequence with queries against
// its reference (check_against), and every output element and LSE entry that no sequence owns
// (stride gaps, tail rows) still poison. Returns the rows (all heads) of each sequence that see
// no key.
std::vector<int> check_varlen_against(const HostVarlen& host, const std::vector<Reference>& refs,
                                      const HostTensor& out, const std::vector<float>& lse);

// `call` throws Error(invalid_argument) whose message names one of `names`.
void check_refused(const std::string& what, const std::function<void()>& call,
                   const std::vector<std::string>& names);

// `call` throws Error(unsupported).
void check_unsupported(const std::string& what, const std::function<void()>& call);

}  // namespace flashjit::test

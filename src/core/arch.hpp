// GPU architecture names: compute capability -> NVRTC target, and the spellings users type.
#pragma once

#include <string>
#include <string_view>
#include <vector>

namespace flashjit::detail {

// The target flashjit compiles for on a GPU of this compute capability (sm_90a on Hopper, so
// the wgmma family is available; the portable families are compiled for the same target).
std::string arch_for_compute_capability(int major, int minor);
// The numeric part of "sm_90a" (90); 0 if malformed.
int arch_number(std::string_view arch);
bool arch_has_accelerated_features(std::string_view arch);  // the 'a' suffix
// The most shared memory one block may opt into on GPUs of this arch (227 KiB on Hopper and
// datacenter Blackwell, 163 KiB on sm_80/87, 99 KiB on the others).
int max_shared_bytes_per_block(std::string_view arch);
// Every canonical arch flashjit knows, in order.
const std::vector<std::string>& known_archs();

}  // namespace flashjit::detail

// FLASHJIT_HOST_DEVICE: marks the constexpr geometry functions that both the host (g++) and the
// kernels (NVRTC) evaluate; plain C++ where the CUDA qualifiers do not exist.
#pragma once

#if defined(__CUDACC__) || defined(__CUDACC_RTC__)
#define FLASHJIT_HOST_DEVICE __host__ __device__
#else
#define FLASHJIT_HOST_DEVICE
#endif

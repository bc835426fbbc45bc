// INDEXER_HD marks functions compiled for both host and device (CUDA, HIP).
// Format code is shared by the cpu backend and the gpu kernels, so it lives in
// headers that every compiler of the project can read.
//
// Only __host__ and __device__ are used here: both device compilers define
// them before the first line of a translation unit (nvcc pre-includes
// cuda_runtime.h; clang -x hip pre-includes __clang_hip_runtime_wrapper.h).
// __forceinline__ is not: HIP defines it in hip_runtime.h only, so a format
// header included ahead of the runtime would not compile as HIP.
#pragma once

#if defined(__CUDACC__) || defined(__HIP__)
#define INDEXER_HD __host__ __device__ inline __attribute__((always_inline))
#else
#define INDEXER_HD inline
#endif

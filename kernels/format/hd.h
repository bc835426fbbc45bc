// INDEXER_HD marks functions compiled for both host and device (CUDA, HIP).
// Format code is shared by the cpu backend and the gpu kernels, so it lives in
// headers that every compiler of the project can read.
#pragma once

#if defined(__CUDACC__) || defined(__HIPCC__) || defined(__HIP__)
#define INDEXER_HD __host__ __device__ __forceinline__
#else
#define INDEXER_HD inline
#endif

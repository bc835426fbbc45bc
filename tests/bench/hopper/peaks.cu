// The sm_90 tensor-core ceilings of indexer_gpu_bench (see peaks.h): the
// mma.sync and wgmma e4m3 rates the logits kernels of kernels/gpu/hopper/
// are built on. CUDA builds only.
#include "kernels/gpu/gpu_compat.h"  // first: the runtime defines __device__ & co.

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <vector>

#include "kernels/gpu/hopper/mma_sm90.h"
#include "kernels/gpu/hopper/wgmma_sm90.h"
#include "tests/bench/bench_util.h"
#include "tests/bench/hopper/peaks.h"

namespace indexer {
namespace bench {
namespace {

// The mma.sync m16n8k32 e4m3 rate: independent accumulator chains per warp.
__global__ void MmaPeakKernel(float* sink, int iters) {
#if INDEXER_GPU_MMA_FP8
  float c[4][4] = {};
  const uint32_t a = 0x38383838u + threadIdx.x, b = 0x30303030u;
  for (int i = 0; i < iters; ++i) {
#pragma unroll
    for (int j = 0; j < 4; ++j) gpu::MmaE4m3(c[j], a, a ^ j, a, a, b, b ^ i);
  }
  float s = 0;
  for (int j = 0; j < 4; ++j) s += c[j][0] + c[j][1] + c[j][2] + c[j][3];
  if (s == 1234.5f) sink[threadIdx.x] = s;
#endif
}

// The wgmma m64n256k32 e4m3 rate the logits kernels are built on: one
// warpgroup per block chains k = 128 (four k32 slices) on shared-memory
// operands in the 128-byte swizzle, waiting once per chain, several blocks
// per SM (operand values do not change the rate).
constexpr int kPeakBlocksPerSm = 3;
__global__ void __launch_bounds__(128) WgmmaPeakKernel(float* sink, int iters) {
#if INDEXER_GPU_WGMMA
  __shared__ __align__(1024) uint8_t a[64 * 128];
  __shared__ __align__(1024) uint8_t b[256 * 128];
  for (int i = threadIdx.x; i < 64 * 128 / 4; i += 128) reinterpret_cast<uint32_t*>(a)[i] = 0x38383838u;
  for (int i = threadIdx.x; i < 256 * 128 / 4; i += 128) reinterpret_cast<uint32_t*>(b)[i] = 0x30303030u;
  gpu::FenceProxyAsyncShared();
  __syncthreads();
  float d[128];
#pragma unroll
  for (int j = 0; j < 128; ++j) d[j] = 0.f;
  for (int i = 0; i < iters; ++i) {
    gpu::WgmmaFence();
#pragma unroll
    for (int k = 0; k < 4; ++k) {
      gpu::WgmmaE4m3N256(d, gpu::Sw128KMajorDesc(a + 32 * k), gpu::Sw128KMajorDesc(b + 32 * k), 1);
    }
    gpu::WgmmaCommit();
    gpu::WgmmaWaitAll();
  }
  float s = 0;
#pragma unroll
  for (int j = 0; j < 128; ++j) s += d[j];
  if (s == 1234.5f) sink[threadIdx.x] = s;
#endif
}

}  // namespace

TensorPeaks MeasureHopperPeaks(gpu::Event e0, gpu::Event e1) {
  TensorPeaks c;
  gpu::DeviceProp prop;
  CHECK_GPU(gpu::GetDeviceProperties(&prop, 0));
  float* sink = nullptr;
  CHECK_GPU(gpu::Malloc(reinterpret_cast<void**>(&sink), 4096));
  const int iters = 20000, blocks = prop.multiProcessorCount * 4, threads = 256;
  // Median ms of `launch` over 4 timed runs after one warm-up.
  auto median_ms = [&](auto launch) {
    std::vector<double> runs;
    for (int i = 0; i < 5; ++i) {
      CHECK_GPU(gpu::EventRecord(e0, nullptr));
      launch();
      CHECK_GPU(gpu::GetLastError());
      CHECK_GPU(gpu::EventRecord(e1, nullptr));
      CHECK_GPU(gpu::StreamSynchronize(nullptr));
      float ms = 0;
      CHECK_GPU(gpu::EventElapsedMs(&ms, e0, e1));
      if (i >= 1) runs.push_back(ms);
    }
    return Median(runs);
  };
  const double flops = 2.0 * 16 * 8 * 32 * 4.0 * iters * (blocks * threads / 32);
  c.mma_tflops = flops / (median_ms([&] { MmaPeakKernel<<<blocks, threads>>>(sink, iters); }) * 1e-3) / 1e12;
  if (prop.major == 9) {
    const int witers = 20000, wblocks = prop.multiProcessorCount * kPeakBlocksPerSm;
    const double wflops = 2.0 * 64 * 256 * 128 * static_cast<double>(witers) * wblocks;
    c.wgmma_tflops =
        wflops / (median_ms([&] { WgmmaPeakKernel<<<wblocks, 128>>>(sink, witers); }) * 1e-3) / 1e12;
  }
  CHECK_GPU(gpu::Free(sink));
  return c;
}

}  // namespace bench
}  // namespace indexer

// The sm_90 tensor-core rates indexer_gpu_bench prints beside its kernels.
// Defined in peaks.cu, which only CUDA builds compile (like
// kernels/gpu/hopper/): callers name it under gpu::kHopperPaths.
#pragma once

#include "kernels/gpu/gpu_compat.h"

namespace indexer {
namespace bench {

struct TensorPeaks {
  double mma_tflops = 0;    // mma.sync m16n8k32 e4m3 (sm_89+)
  double wgmma_tflops = 0;  // wgmma m64n256k32 e4m3 (sm_90a); 0 elsewhere
};

// Times the peak kernels on device 0 with the caller's events; exits the
// process on a runtime error.
TensorPeaks MeasureHopperPeaks(gpu::Event e0, gpu::Event e1);

}  // namespace bench
}  // namespace indexer

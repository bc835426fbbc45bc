// Block-level pieces of the radix-select top-k, shared by the by-rows and
// cooperative kernels (topk_kernels.cu) and the cluster-pair kernel
// (hopper/topk_pair.cu): the passes' radix digits and the block's suffix
// sum of per-thread counts.
#pragma once

#include <cstdint>

#include "kernels/gpu/gpu_compat.h"
#include "kernels/gpu/topk_key.h"

namespace indexer {
namespace gpu {

// Pass p looks at bits [shift, shift + log2(bins)): 31..21, 20..10, 9..0
// (pass 0's digit is TopBin's).
__device__ __forceinline__ int TopkPassShift(int pass) { return pass == 0 ? kTopBinShift : pass == 1 ? 10 : 0; }
__device__ __forceinline__ uint32_t TopkPassBins(int pass) { return pass == 2 ? 1024u : 2048u; }
static_assert(kTopBinShift == 21 && kTopkBins == 2048, "pass 0 is the top 11 bits");

// Sum of `local` over the threads after this one in a block of kT threads
// (suffix sum in threadIdx order): within the warp by shuffles, across
// warps through `warp_sum` [kT / kWarpSize]: up to 16 warps each thread adds
// the later warps' sums itself; more, and each warp takes their suffix sums
// by shuffles (no chain of 31 shared loads). REQUIRES: called by all threads
// of the block.
template <int kT>
__device__ __forceinline__ uint32_t CountAfter(uint32_t local, int lane, int warp,
                                               uint32_t* warp_sum) {
  constexpr int kW = kT / kWarpSize;
  static_assert(kW <= kWarpSize, "one lane per warp of the block");
  uint32_t incl = local;  // sum over lanes >= this one in the warp
  for (int d = 1; d < kWarpSize; d *= 2) {
    const uint32_t v = ShflDown(incl, d);
    if (lane + d < kWarpSize) incl += v;
  }
  if (lane == 0) warp_sum[warp] = incl;
  __syncthreads();
  uint32_t above = incl - local;
  if constexpr (kW <= 16) {
    for (int w = warp + 1; w < kW; ++w) above += warp_sum[w];
  } else {
    uint32_t later = lane < kW ? warp_sum[lane] : 0u;  // lane w: warps >= w
    for (int d = 1; d < kW; d *= 2) {
      const uint32_t v = ShflDown(later, d);
      if (lane + d < kWarpSize) later += v;
    }
    later = ShflIdx(later, min(warp + 1, kWarpSize - 1));
    above += warp + 1 < kW ? later : 0u;
  }
  return above;
}

}  // namespace gpu
}  // namespace indexer

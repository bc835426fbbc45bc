// Top-k per row (SPEC §5) by radix select on order-preserving keys of the
// fp32 logits: three passes of 11, 11 and 10 bits narrow the k-th key's
// prefix, stopping early once the prefix's bin holds exactly the rest;
// then every key above the prefix is taken and the remainder is filled from
// keys equal to it (ties at the cut go either way, as SPEC §5 allows).
// Rows with n <= k list 0..n-1 and then -1.
// Long rows at small batch: the row is cut into slices, each slice's block
// selects its own top-k candidates, one block per row then selects from the
// candidates.
#include "kernels/gpu/gpu_compat.h"  // first: the runtime defines __device__ & co.

#include <algorithm>

#include "kernels/format/numeric.h"
#include "kernels/gpu/params.h"

namespace indexer {
namespace gpu {
namespace {

constexpr int kTopkThreads = 512;
constexpr int kBins = 2048;
static_assert(kTopkThreads % kWarpSize == 0, "whole warps per block");
static_assert(kBins % kTopkThreads == 0, "each thread owns whole bins");
constexpr int kBinsPerThread = kBins / kTopkThreads;
constexpr int kWarps = kTopkThreads / kWarpSize;
// Pass p looks at bits [shift, shift + log2(bins)): 31..21, 20..10, 9..0.
__device__ __forceinline__ int PassShift(int pass) { return pass == 0 ? 21 : pass == 1 ? 10 : 0; }
__device__ __forceinline__ uint32_t PassBins(int pass) { return pass == 2 ? 1024u : 2048u; }

// Larger key = larger logit; -0.0 folded onto +0.0. Finite keys are >= 1,
// so key 0 pads candidate lists.
__device__ __forceinline__ uint32_t OrderedKey(float f) {
  uint32_t u = FloatToBits(f);
  if (u == 0x80000000u) u = 0;
  return (u & 0x80000000u) ? ~u : (u | 0x80000000u);
}

struct SelectShared {
  uint32_t hist[kBins];
  uint32_t warp_sum[kWarps];
  uint32_t bin;        // chosen bin of the pass
  uint32_t above;      // keys in bins above it
  uint32_t n_gt, n_eq; // output counters
};

// Keys [0, n) come from `key(i)`; the k largest go to `emit(slot, i, key)`
// with slots 0..k-1. REQUIRES: n > k > 0, called by all threads.
template <class KeyFn, class EmitFn>
__device__ void BlockSelect(SelectShared& sh, int32_t n, int32_t k,
                            KeyFn key, EmitFn emit) {
  uint32_t prefix = 0, mask = 0;
  uint32_t kk = static_cast<uint32_t>(k);  // keys still to take at the prefix
  const int lane = LaneId(), warp = WarpId();
  for (int pass = 0; pass < 3; ++pass) {
    const int shift = PassShift(pass);
    const uint32_t bins = PassBins(pass);
    for (int b = threadIdx.x; b < kBins; b += kTopkThreads) sh.hist[b] = 0;
    __syncthreads();
    for (int32_t i = threadIdx.x; i < n; i += kTopkThreads) {
      const uint32_t x = key(i);
      if ((x & mask) == prefix) atomicAdd(&sh.hist[(x >> shift) & (bins - 1)], 1u);
    }
    __syncthreads();
    // Suffix sums: thread t owns bins [t*kBinsPerThread, +kBinsPerThread).
    uint32_t local = 0;
#pragma unroll
    for (int j = 0; j < kBinsPerThread; ++j) local += sh.hist[threadIdx.x * kBinsPerThread + j];
    uint32_t incl = local;  // sum over lanes >= this one in the warp
    for (int d = 1; d < kWarpSize; d *= 2) {
      const uint32_t v = ShflDown(incl, d);
      if (lane + d < kWarpSize) incl += v;
    }
    if (lane == 0) sh.warp_sum[warp] = incl;
    __syncthreads();
    uint32_t above = incl - local;
    for (int w = warp + 1; w < kWarps; ++w) above += sh.warp_sum[w];
    if (above < kk && kk <= above + local) {
      for (int j = kBinsPerThread - 1; j >= 0; --j) {
        const uint32_t c = sh.hist[threadIdx.x * kBinsPerThread + j];
        if (above + c >= kk) {
          sh.bin = threadIdx.x * kBinsPerThread + j;
          sh.above = above;
          break;
        }
        above += c;
      }
    }
    __syncthreads();
    const uint32_t bin = sh.bin;
    const uint32_t bin_count = sh.hist[bin];
    prefix |= bin << shift;
    mask |= (bins - 1) << shift;
    kk -= sh.above;
    __syncthreads();  // hist is cleared by the next pass
    if (bin_count == kk) break;  // the prefix's keys are exactly the rest
  }
  if (threadIdx.x == 0) {
    sh.n_gt = 0;
    sh.n_eq = 0;
  }
  __syncthreads();
  const uint32_t n_gt_total = static_cast<uint32_t>(k) - kk;
  for (int32_t i = threadIdx.x; i < n; i += kTopkThreads) {
    const uint32_t x = key(i);
    const uint32_t m = x & mask;
    if (m > prefix) {
      emit(static_cast<int32_t>(atomicAdd(&sh.n_gt, 1u)), i, x);
    } else if (m == prefix) {
      const uint32_t s = atomicAdd(&sh.n_eq, 1u);
      if (s < kk) emit(static_cast<int32_t>(n_gt_total + s), i, x);
    }
  }
  __syncthreads();
}

// Loads keys [0, n) through `key` into `cache` when they fit.
struct TopkShared {
  SelectShared sel;
  uint32_t cache[kTopkCache];
};

// Stage 1 of a split row: slice blockIdx.x of row blockIdx.y selects its
// top min(k, len) candidates, padding the rest of its k slots with key 0.
__global__ void __launch_bounds__(kTopkThreads) TopkSliceKernel(const TopkParams p) {
  __shared__ TopkShared sh;
  const int32_t row = blockIdx.y, slice = blockIdx.x;
  const int32_t n_row = p.row_visible[row];
  if (n_row <= p.topk) return;  // stage 2 lists the row directly
  const int32_t begin = slice * p.slice_len;
  const int32_t len = max(0, min(p.slice_len, n_row - begin));
  const float* x = p.logits + static_cast<int64_t>(row) * p.stride + begin;
  const int64_t c0 = (static_cast<int64_t>(row) * p.slices + slice) * p.topk;
  for (int32_t i = threadIdx.x; i < len; i += kTopkThreads) sh.cache[i] = OrderedKey(x[i]);
  for (int32_t i = len + threadIdx.x; i < p.topk; i += kTopkThreads) {
    p.cand_keys[c0 + i] = 0;
    p.cand_pos[c0 + i] = -1;
  }
  __syncthreads();
  auto emit = [&](int32_t slot, int32_t i, uint32_t key) {
    p.cand_keys[c0 + slot] = key;
    p.cand_pos[c0 + slot] = begin + i;
  };
  if (len <= p.topk) {
    for (int32_t i = threadIdx.x; i < len; i += kTopkThreads) emit(i, i, sh.cache[i]);
    return;
  }
  BlockSelect(sh.sel, len, p.topk, [&](int32_t i) { return sh.cache[i]; }, emit);
}

// One block per row: from the logits (slices == 1) or from the candidates.
__global__ void __launch_bounds__(kTopkThreads) TopkRowKernel(const TopkParams p) {
  __shared__ TopkShared sh;
  const int32_t row = blockIdx.x;
  const int32_t n = p.row_visible[row];
  int32_t* out = p.out + static_cast<int64_t>(row) * p.topk;
  if (n <= p.topk) {
    for (int32_t i = threadIdx.x; i < p.topk; i += kTopkThreads) out[i] = i < n ? i : -1;
    return;
  }
  auto emit_pos = [&](int32_t slot, int32_t i, uint32_t) { out[slot] = i; };
  if (p.slices == 1) {
    const float* x = p.logits + static_cast<int64_t>(row) * p.stride;
    if (n <= kTopkCache) {
      for (int32_t i = threadIdx.x; i < n; i += kTopkThreads) sh.cache[i] = OrderedKey(x[i]);
      __syncthreads();
      BlockSelect(sh.sel, n, p.topk, [&](int32_t i) { return sh.cache[i]; }, emit_pos);
    } else {
      BlockSelect(sh.sel, n, p.topk, [&](int32_t i) { return OrderedKey(x[i]); }, emit_pos);
    }
    return;
  }
  const int32_t nc = p.slices * p.topk;
  const uint32_t* keys = p.cand_keys + static_cast<int64_t>(row) * nc;
  const int32_t* pos = p.cand_pos + static_cast<int64_t>(row) * nc;
  auto emit_cand = [&](int32_t slot, int32_t i, uint32_t) { out[slot] = pos[i]; };
  if (nc <= kTopkCache) {
    for (int32_t i = threadIdx.x; i < nc; i += kTopkThreads) sh.cache[i] = keys[i];
    __syncthreads();
    BlockSelect(sh.sel, nc, p.topk, [&](int32_t i) { return sh.cache[i]; }, emit_cand);
  } else {
    BlockSelect(sh.sel, nc, p.topk, [&](int32_t i) { return keys[i]; }, emit_cand);
  }
}

}  // namespace

void PlanTopkSplit(int32_t num_rows, int32_t max_visible, int32_t topk,
                   int32_t num_sms, int64_t cand_capacity, TopkParams* p) {
  p->slices = 1;
  p->slice_len = max_visible;
  // Splitting pays when a slice can drop entries (slices longer than k)
  // and either the row does not fit one block's cache or the rows alone
  // leave multiprocessors idle.
  const int32_t min_slice = std::max(2 * topk, 2048);
  if (topk <= 0 || max_visible <= std::max(topk, 1) || max_visible < 2 * min_slice) return;
  if (min_slice > kTopkCache) return;
  int64_t slices = (max_visible + kTopkCache - 1) / kTopkCache;
  const int64_t want = (2 * static_cast<int64_t>(num_sms) + num_rows - 1) / std::max(num_rows, 1);
  slices = std::max(slices, std::min<int64_t>(want, max_visible / min_slice));
  const int64_t cap = cand_capacity / (static_cast<int64_t>(num_rows) * topk);
  if (cap < slices) {
    if (max_visible <= kTopkCache) return;  // one block per row still works
    slices = cap;
  }
  if (slices <= 1) return;
  int64_t len = (max_visible + slices - 1) / slices;
  len = (len + 3) / 4 * 4;
  if (len > kTopkCache) return;
  p->slices = static_cast<int32_t>((max_visible + len - 1) / len);
  p->slice_len = static_cast<int32_t>(len);
}

absl::Status LaunchTopk(const TopkParams& p, Stream stream) {
  if (p.num_rows == 0 || p.topk == 0) return absl::OkStatus();
  if (p.slices > 1) {
    GPU_LAUNCH(TopkSliceKernel, dim3(p.slices, p.num_rows), kTopkThreads, 0, stream, p);
  }
  GPU_LAUNCH(TopkRowKernel, p.num_rows, kTopkThreads, 0, stream, p);
  return absl::OkStatus();
}

}  // namespace gpu
}  // namespace indexer

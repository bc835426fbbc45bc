// Top-k per row (SPEC §5) by two blocks of a thread-block cluster (sm_90):
// the by-rows radix select (topk_kernels.cu: TopkRowKernel) with each row's
// keys split between the pair, for launches whose rows alone would leave
// half the multiprocessors idle (at most one row per two SMs: B=64 x 8k
// decode on 132 SMs) and rows of up to 2 x kTopkCache entries.
//
// Why. The by-rows block is a chain of dependent steps over its row's keys
// (H100 ncu at B=64 x 8k: most instructions wait on the one before, 64 of
// 132 SMs busy). Two blocks per row halve every key loop of the chain and
// fill twice the SMs; what they share goes through distributed shared
// memory, not global memory (the cooperative path's slices pay a global
// round trip per stage).
//
// Block `rank` of row r holds keys [rank * h, min(n, rank * h + h)), h =
// ceil(n / 2), in shared memory, its first pass's histogram counted as the
// keys arrive. Each pass p counts into its histogram hist[p % 2]; after the
// cluster barrier every thread reads its two bins of both blocks' histograms
// (its own and the peer's through the cluster window) and both blocks pick
// the same bin from the same totals. One suffix scan carries the totals
// (high 16 bits) and this block's own counts (low 16 bits), so that each
// block also knows how many of the keys above the pick are its own (and by
// difference the peer's). At the end rank 0 writes its keys above the
// prefix to slots [0, gt0) and rank 1 its own to [gt0, gt), then the k - gt
// slots of keys at the prefix go to rank 0's first, rank 1's after, so that
// no count crosses the pair again. Ties at the cut go either way, as SPEC §5
// allows.
//
// Why two histograms: a block clears pass p's histogram only after the
// barrier of pass p - 1, which the peer passes only once it has read pass
// p - 2's (the same buffer); one histogram would need a second barrier per
// pass. Before leaving, each block waits for its peer's arrival (the peer
// may still read this block's last histogram).
#include "kernels/gpu/gpu_compat.h"  // first: the runtime defines __device__ & co.

#include "kernels/gpu/params.h"
#include "kernels/gpu/per_device.h"
#include "kernels/gpu/topk_block.h"
#include "kernels/gpu/topk_key.h"
#include "kernels/gpu/hopper/wgmma_sm90.h"

namespace indexer {
namespace gpu {
namespace {

constexpr int kPairThreads = 1024;
constexpr int kPairBpt = kTopkBins / kPairThreads;  // bins per thread
static_assert(kPairBpt == 2, "each thread owns one aligned pair of bins (one 8-byte peer load)");
constexpr int kPairKeys = kTopkCache / kPairThreads;  // keys per thread at most
// The scan packs (pair total, own count) into one word.
static_assert(2 * kTopkCache < 65536, "a pair's keys fit 16 bits");

struct PairShared {
  uint32_t hist[2][kTopkBins];  // pass p counts into hist[p % 2]; the peer reads it
  uint32_t cache[kTopkCache];   // this block's keys
  uint32_t warp_sum[kPairThreads / kWarpSize];
  // The pass's pick (written by the thread whose bins hold the k-th key):
  // its bin, keys in bins above it (pair, own), keys in it (pair, own).
  uint32_t bin, above, above_own, in_bin, in_bin_own;
  uint32_t n_gt, n_eq;  // output counters
};

__global__ void __cluster_dims__(2, 1, 1) __launch_bounds__(kPairThreads) TopkPairKernel(const TopkParams p) {
#if INDEXER_GPU_WGMMA
  extern __shared__ __align__(16) uint8_t smem_raw[];
  PairShared& sh = *reinterpret_cast<PairShared*>(smem_raw);
  const uint32_t rank = ClusterRank();
  const int tid = threadIdx.x, lane = LaneId(), warp = WarpId();
  GridDependencyWait();  // launched after the logits, possibly before they ended
  const int32_t row = blockIdx.x / 2;
  const int32_t n = p.row_visible[row];
  int32_t* out = p.out + static_cast<int64_t>(row) * p.topk;
  if (n <= p.topk) {  // both blocks see the same n: neither reads the other
    if (rank == 0) {
      for (int32_t i = tid; i < p.topk; i += kPairThreads) out[i] = i < n ? i : -1;
    }
    return;
  }
  const int32_t half = (n + 1) / 2;  // <= kTopkCache (PlanTopkSplit)
  const int32_t begin = static_cast<int32_t>(rank) * half;
  const int32_t len = min(n - begin, half);
  const float* x = p.logits + static_cast<int64_t>(row) * p.stride + begin;

  for (int b = tid; b < 2 * kTopkBins; b += kPairThreads) (&sh.hist[0][0])[b] = 0;
  __syncthreads();
  // The keys into the cache, pass 0 counted as they come (all loads first).
  {
    uint32_t k[kPairKeys];
#pragma unroll
    for (int j = 0; j < kPairKeys; ++j) {
      const int32_t i = tid + j * kPairThreads;
      k[j] = i < len ? OrderedKey(x[i]) : 0u;
    }
#pragma unroll
    for (int j = 0; j < kPairKeys; ++j) {
      const int32_t i = tid + j * kPairThreads;
      if (i < len) {
        sh.cache[i] = k[j];
        atomicAdd(&sh.hist[0][TopBin(k[j])], 1u);
      }
    }
  }
  const uint32_t peer = rank ^ 1u;
  uint32_t mask = 0, prefix = 0;
  uint32_t kk = static_cast<uint32_t>(p.topk);  // keys still to take at the prefix
  uint32_t gt_own = 0;                          // own keys above the prefix
  uint32_t in_bin = 0, in_bin_own = 0;          // keys at the prefix (pair, own)
  for (int pass = 0; pass < 3; ++pass) {
    uint32_t* h = sh.hist[pass & 1];
    const int shift = TopkPassShift(pass);
    const uint32_t bins = TopkPassBins(pass);
    if (pass > 0) {
      if (pass >= 2) {  // hist[0] again: the peer read it before the last barrier
        for (int b = tid; b < kTopkBins; b += kPairThreads) h[b] = 0;
        __syncthreads();
      }
      for (int32_t i = tid; i < len; i += kPairThreads) {
        const uint32_t key = sh.cache[i];
        if ((key & mask) == prefix) atomicAdd(&h[(key >> shift) & (bins - 1)], 1u);
      }
    }
    ClusterSync();  // both blocks' counts of this pass, visible to both
    const int b0 = tid * kPairBpt;
    const uint2 other = LdClusterV2(ClusterPeerAddr(&h[b0], peer));
    const uint32_t own[kPairBpt] = {h[b0], h[b0 + 1]};
    const uint32_t tot[kPairBpt] = {own[0] + other.x, own[1] + other.y};
    const uint32_t packed = (tot[0] + tot[1]) << 16 | (own[0] + own[1]);
    const uint32_t after = CountAfter<kPairThreads>(packed, lane, warp, sh.warp_sum);
    uint32_t at = after >> 16, ao = after & 0xffffu;
    if (at < kk && kk <= at + tot[0] + tot[1]) {
      for (int j = kPairBpt - 1; j >= 0; --j) {
        if (at + tot[j] >= kk) {
          sh.bin = static_cast<uint32_t>(b0 + j);
          sh.above = at;
          sh.above_own = ao;
          sh.in_bin = tot[j];
          sh.in_bin_own = own[j];
          break;
        }
        at += tot[j];
        ao += own[j];
      }
    }
    __syncthreads();
    prefix |= sh.bin << shift;
    mask |= (bins - 1) << shift;
    kk -= sh.above;
    gt_own += sh.above_own;
    in_bin = sh.in_bin;
    in_bin_own = sh.in_bin_own;
    if (in_bin == kk) break;  // the prefix's keys are exactly the rest
  }
  ClusterArrive();  // this block reads the peer's shared memory no more

  // Slots: keys above the prefix, rank 0's first; then the kk at the prefix,
  // rank 0's first.
  const uint32_t gt = static_cast<uint32_t>(p.topk) - kk;
  const uint32_t eq0 = rank == 0 ? in_bin_own : in_bin - in_bin_own;  // rank 0's keys at the prefix
  const uint32_t take0 = min(eq0, kk);
  const uint32_t gt_base = rank == 0 ? 0u : gt - gt_own;
  const uint32_t eq_base = gt + (rank == 0 ? 0u : take0);
  const uint32_t eq_take = rank == 0 ? take0 : kk - take0;
  if (tid == 0) {
    sh.n_gt = 0;
    sh.n_eq = 0;
  }
  __syncthreads();
  for (int32_t i = tid; i < len; i += kPairThreads) {
    const uint32_t m = sh.cache[i] & mask;
    if (m > prefix) {
      out[gt_base + atomicAdd(&sh.n_gt, 1u)] = begin + i;
    } else if (m == prefix) {
      const uint32_t s = atomicAdd(&sh.n_eq, 1u);
      if (s < eq_take) out[eq_base + s] = begin + i;
    }
  }
  ClusterWait();  // the peer is done reading this block's histograms
#else
  (void)p;
#endif  // INDEXER_GPU_WGMMA
}

}  // namespace

absl::Status LaunchTopkPair(const TopkParams& p, Stream stream) {
  if (p.num_rows == 0 || p.topk == 0) return absl::OkStatus();
  // Once per device: the shared memory past the 48 KiB default.
  static PerDevice<absl::Status> setup;
  const absl::Status ready = setup.Get([]() -> absl::Status {
    GPU_RETURN_IF_ERROR(SetMaxDynamicSmem(&TopkPairKernel, static_cast<int>(sizeof(PairShared))));
    return absl::OkStatus();
  });
  if (!ready.ok()) return ready;
  GPU_LAUNCH_AFTER_PREVIOUS(TopkPairKernel, 2 * p.num_rows, kPairThreads, sizeof(PairShared), stream, p);
  return absl::OkStatus();
}

}  // namespace gpu
}  // namespace indexer

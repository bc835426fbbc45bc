// Top-k per row (SPEC §5) by radix select on order-preserving keys of the
// fp32 logits: three passes of 11, 11 and 10 bits narrow the k-th key's
// prefix, stopping early once the prefix's bin holds exactly the rest;
// then every key above the prefix is taken and the remainder is filled from
// keys equal to it (ties at the cut go either way, as SPEC §5 allows).
// Rows with n <= k list 0..n-1 and then -1. Every position goes out
// through TopkOutPos (a candidate consumer's pool slots become entries:
// the kernels' kPool instantiations, launched where pool_blocks is set).
// Rows that fit one block's cache take one block each (TopkRowKernel: 1024
// threads up to one row per SM, else 512). Long rows (any batch) go
// cooperative: the row is cut into slices, one
// block each. (A) every slice adds its histogram of the top 11 key bits to
// the row's global histogram; the last slice to finish picks the bin b of
// the k-th key. (B) every slice writes its keys above b straight to the
// output and queues its keys in b as candidates; (C) the last slice of the
// row to finish B selects the rest of the k from the candidates (they share
// the top 11 bits, so its radix passes start at the second). Two launches
// (the second may be placed while the first drains, on sm_90), no memset:
// C leaves the row's state zeroed. Where the logits kernel built A's
// histogram in its epilogue (TopkParams::hist_ready), B runs alone: each
// slice picks the bin from the finished histogram.
#include "kernels/gpu/gpu_compat.h"  // first: the runtime defines __device__ & co.

#include <algorithm>

#include "kernels/format/numeric.h"
#include "kernels/gpu/knobs.h"
#include "kernels/gpu/params.h"
#include "kernels/gpu/topk_key.h"

namespace indexer {
namespace gpu {
namespace {

constexpr int kTopkThreads = 512;
constexpr int kBins = kTopkBins;
static_assert(kTopkThreads % kWarpSize == 0, "whole warps per block");
static_assert(kBins % kTopkThreads == 0, "each thread owns whole bins");
constexpr int kBinsPerThread = kBins / kTopkThreads;
constexpr int kWarps = kTopkThreads / kWarpSize;
// Pass p looks at bits [shift, shift + log2(bins)): 31..21, 20..10, 9..0.
__device__ __forceinline__ int PassShift(int pass) { return pass == 0 ? 21 : pass == 1 ? 10 : 0; }
__device__ __forceinline__ uint32_t PassBins(int pass) { return pass == 2 ? 1024u : 2048u; }

// Sum of `local` over the threads after this one in a block of kT threads
// (suffix sum in threadIdx order): within the warp by shuffles, across
// warps through `warp_sum` [kT / kWarpSize]: up to 16 warps each thread adds
// the later warps' sums itself; more, and each warp takes their suffix sums
// by shuffles (no chain of 31 shared loads). REQUIRES: called by all threads
// of the block.
template <int kT = kTopkThreads>
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

// Calls body(i, key(i)) for i = threadIdx.x, + kTopkThreads, ... < n, with
// the keys of kBatch iterations loaded before any is used: the loops here
// are chains of dependent steps (a load, then a shared atomic), and with
// one block per multiprocessor (a long row at batch 1) nothing else hides
// a global load's latency.
constexpr int kBatch = 8;
template <int kT = kTopkThreads, class KeyFn, class Body>
__device__ __forceinline__ void ForKeys(int32_t begin, int32_t n, KeyFn key, Body body) {
  int32_t i = begin + threadIdx.x;
  for (; i + (kBatch - 1) * kT < n; i += kBatch * kT) {
    uint32_t x[kBatch];
#pragma unroll
    for (int b = 0; b < kBatch; ++b) x[b] = key(i + b * kT);
#pragma unroll
    for (int b = 0; b < kBatch; ++b) body(i + b * kT, x[b]);
  }
  for (; i < n; i += kT) body(i, key(i));
}

template <int kT = kTopkThreads>
struct SelectShared {
  uint32_t hist[kBins];
  uint32_t warp_sum[kT / kWarpSize];
  uint32_t bin;        // chosen bin of the pass
  uint32_t above;      // keys in bins above it
  uint32_t n_gt, n_eq; // output counters
};

// Keys [0, n) come from `key(i)`; the k largest go to `emit(slot, i, key)`
// with slots 0..k-1. Passes before `first_pass` are known to select
// `prefix` (every key shares those bits: candidates of one top bin skip
// pass 0). REQUIRES: n > k > 0, called by all threads.
template <int kT, class KeyFn, class EmitFn>
__device__ void BlockSelect(SelectShared<kT>& sh, int32_t n, int32_t k,
                            KeyFn key, EmitFn emit, int first_pass = 0,
                            uint32_t prefix = 0) {
  uint32_t mask = 0;
  for (int pass = 0; pass < first_pass; ++pass) mask |= (PassBins(pass) - 1) << PassShift(pass);
  constexpr int kBpt = kBins / kT;  // bins per thread
  static_assert(kBins % kT == 0, "each thread owns whole bins");
  uint32_t kk = static_cast<uint32_t>(k);  // keys still to take at the prefix
  const int lane = LaneId(), warp = WarpId();
  for (int pass = first_pass; pass < 3; ++pass) {
    const int shift = PassShift(pass);
    const uint32_t bins = PassBins(pass);
    for (int b = threadIdx.x; b < kBins; b += kT) sh.hist[b] = 0;
    __syncthreads();
    ForKeys<kT>(0, n, key, [&](int32_t, uint32_t x) {
      if ((x & mask) == prefix) atomicAdd(&sh.hist[(x >> shift) & (bins - 1)], 1u);
    });
    __syncthreads();
    // Suffix sums: thread t owns bins [t*kBpt, +kBpt).
    uint32_t local = 0;
#pragma unroll
    for (int j = 0; j < kBpt; ++j) local += sh.hist[threadIdx.x * kBpt + j];
    uint32_t above = CountAfter<kT>(local, lane, warp, sh.warp_sum);
    if (above < kk && kk <= above + local) {
      for (int j = kBpt - 1; j >= 0; --j) {
        const uint32_t c = sh.hist[threadIdx.x * kBpt + j];
        if (above + c >= kk) {
          sh.bin = threadIdx.x * kBpt + j;
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
  ForKeys<kT>(0, n, key, [&](int32_t i, uint32_t x) {
    const uint32_t m = x & mask;
    if (m > prefix) {
      emit(static_cast<int32_t>(atomicAdd(&sh.n_gt, 1u)), i, x);
    } else if (m == prefix) {
      const uint32_t s = atomicAdd(&sh.n_eq, 1u);
      if (s < kk) emit(static_cast<int32_t>(n_gt_total + s), i, x);
    }
  });
  __syncthreads();
}

// Loads keys [0, n) through `key` into `cache` when they fit.
template <int kT = kTopkThreads>
struct TopkShared {
  SelectShared<kT> sel;
  uint32_t cache[kTopkCache];
};

// Global state of one row in the cooperative path: zero before stage A
// (zeroed once at start-up, and by stage C after each use).
struct CoopRow {
  uint32_t hist[kBins];
  uint32_t done;    // slices finished with stage A
  uint32_t bin;     // bin of the k-th key (top 11 bits)
  uint32_t above;   // keys in bins above it
  uint32_t n_out;   // keys written by stage B
  uint32_t n_cand;  // candidates queued by stage B
  uint32_t done_b;  // slices finished with stage B
  uint32_t pad[2];
};
static_assert(sizeof(CoopRow) == kTopkStateWords * 4, "state size the host reserves");

struct SliceShared {
  uint32_t hist[kBins];
  uint32_t warp_sum[kWarps];
  uint32_t last;
};

// This thread's bins of the row's complete histogram (from L2), for
// PickRowBin: loaded apart so that they can be in flight with other loads.
struct RowBins {
  uint32_t c[kBinsPerThread];
};
__device__ __forceinline__ RowBins LoadRowBins(const CoopRow* st) {
  RowBins r;
#pragma unroll
  for (int j = 0; j < kBinsPerThread; ++j) r.c[j] = LoadCg(&st->hist[threadIdx.x * kBinsPerThread + j]);
  return r;
}

// The bin of the row's k-th key from its complete histogram (each thread's
// bins from LoadRowBins): one thread writes it to *bin and the keys in bins
// above it to *above. REQUIRES: called by all threads; the histogram sums
// to n > k.
__device__ void PickRowBin(const RowBins& mine, uint32_t k, uint32_t* warp_sum, uint32_t* bin,
                           uint32_t* above_out) {
  uint32_t local = 0;
#pragma unroll
  for (int j = 0; j < kBinsPerThread; ++j) local += mine.c[j];
  const int lane = LaneId(), warp = WarpId();
  uint32_t above = CountAfter(local, lane, warp, warp_sum);
  if (above < k && k <= above + local) {
    for (int j = kBinsPerThread - 1; j >= 0; --j) {
      if (above + mine.c[j] >= k) {
        *bin = threadIdx.x * kBinsPerThread + j;
        *above_out = above;
        break;
      }
      above += mine.c[j];
    }
  }
}

// Stage A: slice blockIdx.x of row blockIdx.y.
__global__ void __launch_bounds__(kTopkThreads) CoopHistKernel(const TopkParams p) {
  __shared__ SliceShared sh;
  GridDependencyWait();    // launched after the logits, possibly before they ended
  AllowDependentLaunch();  // stage B's blocks may be placed now; they wait for this grid
  const int32_t row = blockIdx.y;
  const int32_t n = p.row_visible[row];
  if (n <= p.topk) return;
  CoopRow* st = reinterpret_cast<CoopRow*>(p.state) + row;
  const int32_t begin = blockIdx.x * p.slice_len;
  const int32_t end = min(n, begin + p.slice_len);
  const float* x = p.logits + static_cast<int64_t>(row) * p.stride;
  for (int b = threadIdx.x; b < kBins; b += kTopkThreads) sh.hist[b] = 0;
  __syncthreads();
  ForKeys(begin, end, [&](int32_t i) { return OrderedKey(x[i]); },
          [&](int32_t, uint32_t key) { atomicAdd(&sh.hist[TopBin(key)], 1u); });
  __syncthreads();
  for (int b = threadIdx.x; b < kBins; b += kTopkThreads) {
    if (sh.hist[b] != 0) atomicAdd(&st->hist[b], sh.hist[b]);
  }
  // As stage B's arrival: one thread's release fence after the CTA barrier.
  __syncthreads();
  if (threadIdx.x == 0) {
    __threadfence();
    sh.last = atomicAdd(&st->done, 1u) == gridDim.x - 1;
    if (sh.last) __threadfence();
  }
  __syncthreads();
  if (!sh.last) return;
  // ---- the last slice: bin of the k-th key from the row's histogram -------
  PickRowBin(LoadRowBins(st), static_cast<uint32_t>(p.topk), sh.warp_sum, &st->bin, &st->above);
}

// Stage C, run by the last slice of stage B to finish its row: the rest of
// the k from the candidates, then the row's state zeroed for the next use.
template <bool kPool>
__device__ void CoopFinishRow(const TopkParams& p, int32_t row, CoopRow* st, TopkShared<>& sh) {
  int32_t* out = p.out + static_cast<int64_t>(row) * p.topk;
  // L2 reads after the fence: independent loads, not a chain of atomics.
  const int32_t above = static_cast<int32_t>(LoadCg(&st->above));
  const int32_t nc = static_cast<int32_t>(LoadCg(&st->n_cand));
  const uint32_t bin = LoadCg(&st->bin);  // every candidate's top bits
  const int32_t kk = p.topk - above;
  __syncthreads();
  for (int b = threadIdx.x; b < kTopkStateWords; b += kTopkThreads) reinterpret_cast<uint32_t*>(st)[b] = 0;
  const uint32_t* ck = p.cand_keys + static_cast<int64_t>(row) * p.cand_stride;
  const int32_t* cp = p.cand_pos + static_cast<int64_t>(row) * p.cand_stride;
  int32_t* rest = out + above;
  if (nc <= kk) {
    for (int32_t i = threadIdx.x; i < nc; i += kTopkThreads) rest[i] = TopkOutPos<kPool>(p, row, LoadCg(cp + i));
    return;
  }
  // The selection lists candidate indices in the histogram's words (free
  // once its passes are done); their positions are then gathered with
  // independent loads, not one dependent load per emitted key.
  const bool list = kk <= kBins;
  uint32_t* picked = sh.sel.hist;
  auto emit = [&](int32_t slot, int32_t i, uint32_t) {
    if (list) picked[slot] = static_cast<uint32_t>(i);
    else rest[slot] = TopkOutPos<kPool>(p, row, LoadCg(cp + i));
  };
  if (nc <= kTopkCache) {
    ForKeys(0, nc, [&](int32_t i) { return LoadCg(ck + i); }, [&](int32_t i, uint32_t key) { sh.cache[i] = key; });
    __syncthreads();
    BlockSelect(sh.sel, nc, kk, [&](int32_t i) { return sh.cache[i]; }, emit, 1, bin << 21);
  } else {
    BlockSelect(sh.sel, nc, kk, [&](int32_t i) { return LoadCg(ck + i); }, emit, 1, bin << 21);
  }
  if (list) {
    for (int32_t j = threadIdx.x; j < kk; j += kTopkThreads) rest[j] = TopkOutPos<kPool>(p, row, LoadCg(cp + picked[j]));
  }
}

// ---- a slice's keys by quads ------------------------------------------------
// Thread t owns the quads (4 consecutive keys) t, t + kTopkThreads, ... of a
// slice of <= kTopkCache keys: it loads them (16-byte loads where the row
// is aligned, two or four in flight: LoadQuads), keeps them in shared memory for its
// own later passes (no barrier: no other thread reads them) and counts and
// writes them itself. One thread's keys are consecutive, so a block's
// counts are one suffix scan (CountAfter) of packed per-thread tallies.
// (Stage B first loaded one key per lane per load and counted and wrote with
// a ballot per 32 keys: H200 ncu at B=128 x 128k, 62 % of issue slots busy,
// long_scoreboard on the scalar loads first at B=64 x 32k.)
constexpr int kQuads = kTopkCache / 4 / kTopkThreads;  // quads per thread
static_assert(kQuads * 4 * kTopkThreads == kTopkCache, "a slice is whole quads per thread");
// gt in the low half, eq in the high half: per block both are <= kTopkCache.
static_assert(kTopkCache < 65536, "tallies pack two 16-bit counts");

// Keys [0, len) of x (len <= kTopkCache) into cache[0, len), each thread its
// own quads, kInFlight of them loaded at a time (two where stage B's
// 32-register cap would spill the rest).
template <int kInFlight = kQuads>
__device__ __forceinline__ void LoadQuads(const float* x, int32_t len, uint32_t* cache) {
  static_assert(kQuads % kInFlight == 0, "whole batches of quads");
  const bool vec = (reinterpret_cast<uintptr_t>(x) & 15u) == 0;
#pragma unroll
  for (int j0 = 0; j0 < kQuads; j0 += kInFlight) {
    float4 v[kInFlight];
#pragma unroll
    for (int j = 0; j < kInFlight; ++j) {
      const int32_t i = 4 * (static_cast<int32_t>(threadIdx.x) + (j0 + j) * kTopkThreads);
      if (vec && i + 3 < len) {
        v[j] = *reinterpret_cast<const float4*>(x + i);
      } else {
        v[j].x = i < len ? x[i] : 0.f;
        v[j].y = i + 1 < len ? x[i + 1] : 0.f;
        v[j].z = i + 2 < len ? x[i + 2] : 0.f;
        v[j].w = i + 3 < len ? x[i + 3] : 0.f;
      }
    }
#pragma unroll
    for (int j = 0; j < kInFlight; ++j) {
      const int32_t i = 4 * (static_cast<int32_t>(threadIdx.x) + (j0 + j) * kTopkThreads);
      if (i < len) {
        *reinterpret_cast<uint4*>(cache + i) =
            make_uint4(OrderedKey(v[j].x), OrderedKey(v[j].y), OrderedKey(v[j].z), OrderedKey(v[j].w));
      }
    }
  }
}

// Calls body(i, key) for this thread's keys i < len, in index order.
template <class Body>
__device__ __forceinline__ void ForQuadKeys(const uint32_t* cache, int32_t len, Body body) {
#pragma unroll
  for (int j = 0; j < kQuads; ++j) {
    const int32_t i = 4 * (static_cast<int32_t>(threadIdx.x) + j * kTopkThreads);
    if (i < len) {
      const uint4 k = *reinterpret_cast<const uint4*>(cache + i);
      body(i, k.x);
      if (i + 1 < len) body(i + 1, k.y);
      if (i + 2 < len) body(i + 2, k.z);
      if (i + 3 < len) body(i + 3, k.w);
    }
  }
}

// This thread's keys above `bin` (low half) and in it (high half).
__device__ __forceinline__ uint32_t QuadTally(const uint32_t* cache, int32_t len, uint32_t bin) {
  uint32_t c = 0;
  ForQuadKeys(cache, len, [&](int32_t, uint32_t key) {
    const uint32_t b = TopBin(key);
    c += (b > bin ? 1u : 0u) + (b == bin ? 0x10000u : 0u);
  });
  return c;
}

// Keys above `bin` to gt(slot, i) from slot gt_at on, keys in it to
// eq(slot, i, key) from eq_at on.
template <class Gt, class Eq>
__device__ __forceinline__ void QuadEmit(const uint32_t* cache, int32_t len, uint32_t bin, uint32_t gt_at,
                                         uint32_t eq_at, Gt gt, Eq eq) {
  ForQuadKeys(cache, len, [&](int32_t i, uint32_t key) {
    const uint32_t b = TopBin(key);
    if (b > bin) gt(gt_at++, i);
    else if (b == bin) eq(eq_at++, i, key);
  });
}

// Stage B: keys above the bin go out, keys in it become candidates; the
// last slice of the row then runs stage C. Rows with n <= k are listed.
// Slots are reserved once per block (one atomic per counter) from a suffix
// scan of the threads' tallies; each thread then writes its own keys.
// kMinBlocks: the register cap in blocks per SM (TopkEmitCap): 4 (32
// registers) for launches of more than three blocks per SM, 3 (40) for
// more than two, else 1 (64). H200, same call (the ballot form of stage
// B): B=128 x 128k top-k 80.5 -> 63.6 us at 4 (71.2 at 3), B=128 x 32k
// 28.0 -> 24.5, B=64 x 128k 42.6 -> 35.5; the V4.1 B=64 consumer (2-3
// blocks per SM) 24.9 uncapped, 25.2 at 4, 23.2 at 3; but the V4.1 B=8
// consumer's 128 blocks 17.7 -> 19.6 at 4: a cap costs where the blocks fit
// anyway. By quads, the cap still pays: B=128 x 128k 49.7-49.8 us at 4
// (56 bytes spilled), 51.4 at 3 (INDEXER_GPU_TOPK_BLOCKS_PER_SM=3).
template <int kMinBlocks, bool kPool>
__global__ void __launch_bounds__(kTopkThreads, kMinBlocks) CoopEmitKernel(const TopkParams p) {
  __shared__ __align__(16) TopkShared<> sh;
  __shared__ uint32_t base[2];
  __shared__ uint32_t last;
  GridDependencyWait();  // launched after stage A, possibly before it ended
  const int32_t row = blockIdx.y;
  const int32_t n = p.row_visible[row];
  if (n <= p.topk) {
    if (blockIdx.x == 0) {
      int32_t* out = p.out + static_cast<int64_t>(row) * p.topk;
      for (int32_t i = threadIdx.x; i < p.topk; i += kTopkThreads) out[i] = i < n ? TopkOutPos<kPool>(p, row, i) : -1;
    }
    return;
  }
  CoopRow* st = reinterpret_cast<CoopRow*>(p.state) + row;
  const int32_t begin = blockIdx.x * p.slice_len;
  const int32_t len = max(0, min(n, begin + p.slice_len) - begin);  // <= kTopkCache
  const float* x = p.logits + static_cast<int64_t>(row) * p.stride + begin;
  int32_t* out = p.out + static_cast<int64_t>(row) * p.topk;
  uint32_t* ck = p.cand_keys + static_cast<int64_t>(row) * p.cand_stride;
  int32_t* cp = p.cand_pos + static_cast<int64_t>(row) * p.cand_stride;
  const int lane = LaneId(), warp = WarpId();
  const uint32_t bin_a = p.hist_ready ? 0u : st->bin;  // stage A's pick
  // No stage A: the logits kernel left the row's histogram complete, and
  // every slice picks the bin itself (2048 words from L2 and a scan, less
  // than a launch; the words in flight with the key loads).
  RowBins bins;
  if (p.hist_ready) bins = LoadRowBins(st);
  LoadQuads<kMinBlocks == 4 ? 2 : kQuads>(x, len, sh.cache);
  uint32_t bin;
  if (p.hist_ready) {
    // One slice records the bin for stage C, before its stage-B arrival below.
    PickRowBin(bins, static_cast<uint32_t>(p.topk), sh.sel.warp_sum, &sh.sel.bin, &sh.sel.above);
    __syncthreads();
    bin = sh.sel.bin;
    if (blockIdx.x == 0 && threadIdx.x == 0) {
      st->bin = bin;
      st->above = sh.sel.above;
    }
  } else {
    bin = bin_a;
  }
  const uint32_t mine = QuadTally(sh.cache, len, bin);
  const uint32_t after = CountAfter(mine, lane, warp, sh.sel.warp_sum);
  if (threadIdx.x == 0) {
    const uint32_t tg = (after + mine) & 0xffffu, te = (after + mine) >> 16;
    base[0] = tg ? atomicAdd(&st->n_out, tg) : 0u;
    base[1] = te ? atomicAdd(&st->n_cand, te) : 0u;
  }
  __syncthreads();
  QuadEmit(
      sh.cache, len, bin, base[0] + (after & 0xffffu), base[1] + (after >> 16),
      [&](uint32_t slot, int32_t i) { out[slot] = TopkOutPos<kPool>(p, row, begin + i); },
      [&](uint32_t slot, int32_t i, uint32_t key) {
        ck[slot] = key;
        cp[slot] = begin + i;
      });
  // The block's writes, then one thread's release fence and arrival (as a
  // grid barrier: the CTA barrier orders every thread's writes before it);
  // the row's last slice acquires with its fence before the CTA barrier.
  // (A fence in every thread held 7 % of stage B's samples, H200 ncu.)
  __syncthreads();
  if (threadIdx.x == 0) {
    __threadfence();
    last = atomicAdd(&st->done_b, 1u) == gridDim.x - 1;
    if (last) __threadfence();
  }
  __syncthreads();
  if (!last) return;
  CoopFinishRow<kPool>(p, row, st, sh);
}

// One block per row straight from the logits (rows that fit the cache, or
// when the candidate buffers are too small for the cooperative path), of
// kT = TopkParams::row_threads threads. The block is a chain of dependent
// steps (H100 ncu at B=64 x 8k, 512 threads: 10.9 cycles per issued
// instruction, most of them waiting on the one before; 14k of the
// kernel's 21k cycles active on the 64 SMs it uses): 1024 threads halve
// each thread's share of every pass. H100, same call, top-k us at 1024 /
// 512 threads: B=1 x 8k 8.4 / 9.1, B=8 8.7 / 9.5, B=64 9.9 / 10.5, B=128
// 10.4 / 11.0, B=64 next_n 2 11.6 / 12.4; but B=128 next_n 2 (256 rows,
// two blocks an SM) 16.8 / 15.6: PlanTopkSplit takes 1024 up to one row
// per SM. (Radix digits below the row's common prefix, and the output by
// per-thread tallies instead of an atomic per key, did not move B=64 x 8k:
// 10.5 us both ways, H100, s25. Nor did two blocks a row, a cluster pair
// reading each other's histograms through distributed shared memory
// (90fee29, reverted): H100, same call, B=64 x 8k 11.0 us against
// 10.0-10.1, B=1 and B=8 x 8k +0.6-0.7, only 2 and 16 rows of next_n 2
// gained 0.4-0.7. What bounds the block is each pass's barriers and scan,
// which the pair keeps and lengthens by a cluster barrier and a remote
// read; its key loops were already 8 keys a thread.)
template <int kT, bool kPool>
__global__ void __launch_bounds__(kT) TopkRowKernel(const TopkParams p) {
  __shared__ TopkShared<kT> sh;
  GridDependencyWait();  // launched after the logits, possibly before they ended
  const int32_t row = blockIdx.x;
  const int32_t n = p.row_visible[row];
  int32_t* out = p.out + static_cast<int64_t>(row) * p.topk;
  if (n <= p.topk) {
    for (int32_t i = threadIdx.x; i < p.topk; i += kT) out[i] = i < n ? TopkOutPos<kPool>(p, row, i) : -1;
    return;
  }
  auto emit_pos = [&](int32_t slot, int32_t i, uint32_t) { out[slot] = TopkOutPos<kPool>(p, row, i); };
  const float* x = p.logits + static_cast<int64_t>(row) * p.stride;
  if (n <= kTopkCache) {
    ForKeys<kT>(0, n, [&](int32_t i) { return OrderedKey(x[i]); },
                [&](int32_t i, uint32_t key) { sh.cache[i] = key; });
    __syncthreads();
    BlockSelect(sh.sel, n, p.topk, [&](int32_t i) { return sh.cache[i]; }, emit_pos);
  } else {
    BlockSelect(sh.sel, n, p.topk, [&](int32_t i) { return OrderedKey(x[i]); }, emit_pos);
  }
}

}  // namespace

void PlanTopkSplit(int32_t num_rows, int32_t max_visible, int32_t topk,
                   int32_t num_sms, int64_t cand_capacity, TopkParams* p) {
  p->slices = 1;
  p->slice_len = max_visible;
  p->cand_stride = 0;
  p->emit_cap = 1;
  // By rows: 1024 threads a block up to one row per SM (TopkRowKernel).
  const int32_t forced = Knobs().topk_row_threads;
  p->row_threads = forced != 0 ? forced : num_rows <= num_sms ? 1024 : kTopkThreads;
  // Cooperative when a row is too long for one block's cache or the rows
  // alone leave multiprocessors idle, and the candidates fit.
  if (topk <= 0 || max_visible <= topk) return;
  const bool long_rows = max_visible > kTopkCache;
  // (Rows of 8192 entries at B=64 taken cooperatively: top-k 12.4-12.6 us
  // against 10.4 by rows, H200, h200_2026-12-05_s22.md.)
  const bool few_rows = static_cast<int64_t>(num_rows) * 2 < num_sms && max_visible >= 2 * kTopkCache;
  if (!long_rows && !few_rows) return;
  const int64_t stride = (static_cast<int64_t>(max_visible) + 3) / 4 * 4;
  if (stride * num_rows > cand_capacity) return;
  // About two blocks per multiprocessor over the launch (knob
  // INDEXER_GPU_TOPK_SLICE_BLOCKS), slices of 1k..8k.
  const int64_t per_sm = Knobs().topk_slice_blocks;
  const int64_t want = std::max<int64_t>(1, (per_sm * num_sms + num_rows - 1) / num_rows);
  int64_t len = (max_visible + want - 1) / want;
  len = std::clamp<int64_t>((len + 255) / 256 * 256, 1024, kTopkCache);
  p->slice_len = static_cast<int32_t>(len);
  p->slices = static_cast<int32_t>((max_visible + len - 1) / len);
  p->cand_stride = stride;
  p->emit_cap = TopkEmitCap(int64_t{p->slices} * num_rows, num_sms);
}

int32_t TopkEmitCap(int64_t blocks, int32_t num_sms) {
  if (const int32_t k = Knobs().topk_blocks_per_sm; k > 0) return k;
  if (num_sms <= 0 || blocks <= 2 * int64_t{num_sms}) return 1;
  return blocks <= 3 * int64_t{num_sms} ? 3 : 4;
}

template <bool kPool>
absl::Status LaunchTopkOf(const TopkParams& p, Stream stream) {
  // Every top-k kernel waits for the kernel before it (GridDependencyWait)
  // before it reads: launched after-previous, a logits kernel that lets its
  // dependents start (LogitsParams::launch_dependents) overlaps their
  // placement with its tail.
  if (p.cand_stride == 0) {
    if (p.row_threads == 1024) {
      auto* rows = &TopkRowKernel<1024, kPool>;
      GPU_LAUNCH_AFTER_PREVIOUS(rows, p.num_rows, 1024, 0, stream, p);
    } else {
      auto* rows = &TopkRowKernel<kTopkThreads, kPool>;
      GPU_LAUNCH_AFTER_PREVIOUS(rows, p.num_rows, kTopkThreads, 0, stream, p);
    }
    return absl::OkStatus();
  }
  const dim3 grid(p.slices, p.num_rows);
  auto* emit = p.emit_cap == 4   ? &CoopEmitKernel<4, kPool>
               : p.emit_cap == 3 ? &CoopEmitKernel<3, kPool>
                                 : &CoopEmitKernel<1, kPool>;
  if (!p.hist_ready) GPU_LAUNCH_AFTER_PREVIOUS(CoopHistKernel, grid, kTopkThreads, 0, stream, p);
  // Stage B may start while stage A drains (it waits for A's results).
  GPU_LAUNCH_AFTER_PREVIOUS(emit, grid, kTopkThreads, 0, stream, p);
  return absl::OkStatus();
}

absl::Status LaunchTopk(const TopkParams& p, Stream stream) {
  if (p.num_rows == 0 || p.topk == 0) return absl::OkStatus();
  return p.pool_blocks != nullptr ? LaunchTopkOf<true>(p, stream) : LaunchTopkOf<false>(p, stream);
}

}  // namespace gpu
}  // namespace indexer

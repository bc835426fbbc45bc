// Kernels of the two-level candidate path and the MiniMax block path
// (SPEC §5) on the gpu backend. They compose with the dense logits and the
// top-k kernels:
//   source:   dense logits -> top-k (its own output) -> block maxima, in
//             place -> top-k over the maxima -> FinishPool (pin the newest
//             block, ascending block ids, entries below n_r) -> the step's
//             pool arrays.
//   consumer: dense logits -> GatherPool (the pool's logits compacted to the
//             front of the row, in place) -> top-k over the slots, which
//             writes the entries the slots hold (TopkParams::pool_blocks;
//             whole pools of <= topk entries listed without their logits).
//             The gather walk instead scores only the pool, straight into
//             compact rows (gather_logits.h), and the top-k follows it.
//   block:    BlockScores (per head, row, page: max of scale * q . k,
//             sentinels for init / local blocks) -> BlockTopk, one warp
//             per (head, row), all heads in one launch.
// Portable (CUDA and HIP): no wave-width assumption beyond kWarpSize.
#include "kernels/gpu/gpu_compat.h"  // first: the runtime defines __device__ & co.

#include <algorithm>
#include <cstdint>

#include "absl/strings/str_cat.h"
#include "kernels/format/fp8.h"
#include "kernels/format/mxfp4.h"
#include "kernels/gpu/paged.h"
#include "kernels/gpu/params.h"

namespace indexer {
namespace gpu {
namespace {

constexpr int kPathThreads = 256;
static_assert(kPathThreads % kWarpSize == 0, "whole warps per block");
constexpr int kPathWarps = kPathThreads / kWarpSize;

__device__ __forceinline__ int32_t CeilDivD(int32_t a, int32_t b) { return (a + b - 1) / b; }

// ---- block maxima, in place -------------------------------------------------
// One block per row: logits[r, b] = max over [b * bs, min(n, (b + 1) * bs)).
// Rounds of kPathThreads blocks: a round reads positions >= its first block
// id times bs, which no earlier round wrote, and writes only after every
// thread of the block has read.
__global__ void __launch_bounds__(kPathThreads) BlockMaximaKernel(const BlockMaxParams p) {
  const int32_t r = blockIdx.x;
  const int32_t n = p.row_visible[r];
  const int32_t bs = p.block_size;
  const int32_t nb = CeilDivD(n, bs);
  float* row = p.logits + static_cast<int64_t>(r) * p.stride;
  if (threadIdx.x == 0) p.num_blocks[r] = nb;
  for (int32_t base = 0; base < nb; base += kPathThreads) {
    const int32_t b = base + static_cast<int32_t>(threadIdx.x);
    float m = 0.f;
    if (b < nb) {
      const int32_t e0 = b * bs, e1 = min(n, e0 + bs);
      m = row[e0];
      for (int32_t e = e0 + 1; e < e1; ++e) m = fmaxf(m, row[e]);
    }
    __syncthreads();
    if (b < nb) row[b] = m;
    __syncthreads();
  }
}

// Out of place: block (x, r) takes the row's blocks [x * kPathThreads, +
// kPathThreads), one a thread; the whole device works on every row (in
// place, one thread block walks a row: a V4.1 source at B=8 x 128k, 8
// blocks of 256 threads reading 512 KiB each, spent ~45 us there, H100,
// s26). Blocks of 8 entries on 16-byte aligned rows load as two float4.
__global__ void __launch_bounds__(kPathThreads) BlockMaximaSpreadKernel(const BlockMaxParams p) {
  const int32_t r = blockIdx.y;
  const int32_t n = p.row_visible[r];
  const int32_t bs = p.block_size;
  const int32_t nb = CeilDivD(n, bs);
  if (blockIdx.x == 0 && threadIdx.x == 0) p.num_blocks[r] = nb;
  const int32_t b = static_cast<int32_t>(blockIdx.x) * kPathThreads + static_cast<int32_t>(threadIdx.x);
  if (b >= nb) return;
  const float* row = p.logits + static_cast<int64_t>(r) * p.stride;
  const int32_t e0 = b * bs, e1 = min(n, e0 + bs);
  float m;
  if (bs == 8 && e1 - e0 == 8 && (reinterpret_cast<uintptr_t>(row + e0) & 15u) == 0) {
    const float4 a = *reinterpret_cast<const float4*>(row + e0);
    const float4 c = *reinterpret_cast<const float4*>(row + e0 + 4);
    m = fmaxf(fmaxf(fmaxf(a.x, a.y), fmaxf(a.z, a.w)), fmaxf(fmaxf(c.x, c.y), fmaxf(c.z, c.w)));
  } else {
    m = row[e0];
    for (int32_t e = e0 + 1; e < e1; ++e) m = fmaxf(m, row[e]);
  }
  p.maxima[static_cast<int64_t>(r) * p.maxima_stride + b] = m;
}

// ---- pool of a row ------------------------------------------------------------
// One block per row. Rows of nb <= k blocks take all of them. Otherwise the
// top-k selection `sel` (k block ids), the newest block pinned in place of
// the weakest chosen one (smallest maximum, the larger id on ties: the last
// of the cpu backend's order), written in ascending order through a bitmap
// of the row's blocks (dynamic shared memory, one bit per block).
__global__ void __launch_bounds__(kPathThreads) FinishPoolKernel(const PoolParams p) {
  extern __shared__ uint32_t bits[];
  __shared__ float best_v[kPathThreads];
  __shared__ int32_t best_i[kPathThreads];
  __shared__ uint32_t scan[kPathThreads];
  __shared__ int32_t has_newest;
  const int32_t r = blockIdx.x, t = threadIdx.x;
  const int32_t n = p.row_visible[r], bs = p.block_size, k = p.topk_blocks;
  const int32_t nb = CeilDivD(n, bs);
  int32_t* blocks = p.blocks + static_cast<int64_t>(r) * k;
  if (nb <= k) {
    for (int32_t i = t; i < k; i += kPathThreads) blocks[i] = i < nb ? i : -1;
    if (t == 0) p.entries[r] = n;
    return;
  }
  const int32_t* sel = p.sel + static_cast<int64_t>(r) * p.sel_stride;
  const float* maxima = p.maxima + static_cast<int64_t>(r) * p.stride;
  const int32_t words = (nb + 31) / 32;
  for (int32_t w = t; w < words; w += kPathThreads) bits[w] = 0u;
  if (t == 0) has_newest = 0;
  __syncthreads();
  // The weakest chosen block, for the pin.
  float wv = 0.f;
  int32_t wi = -1;
  for (int32_t i = t; i < k; i += kPathThreads) {
    const int32_t b = sel[i];
    if (b == nb - 1) has_newest = 1;
    const float v = maxima[b];
    if (wi < 0 || v < wv || (v == wv && b > wi)) {
      wv = v;
      wi = b;
    }
  }
  best_v[t] = wv;
  best_i[t] = wi;
  __syncthreads();
  for (int32_t s = kPathThreads / 2; s > 0; s /= 2) {
    if (t < s) {
      const float v = best_v[t + s];
      const int32_t i = best_i[t + s];
      if (i >= 0 && (best_i[t] < 0 || v < best_v[t] || (v == best_v[t] && i > best_i[t]))) {
        best_v[t] = v;
        best_i[t] = i;
      }
    }
    __syncthreads();
  }
  const bool pin = p.pin_newest && !has_newest;
  const int32_t dropped = pin ? best_i[0] : -1;
  for (int32_t i = t; i < k; i += kPathThreads) {
    const int32_t b = sel[i];
    if (b != dropped) atomicOr(&bits[b / 32], 1u << (b % 32));
  }
  if (pin && t == 0) atomicOr(&bits[(nb - 1) / 32], 1u << ((nb - 1) % 32));
  __syncthreads();
  // Ascending ids: each thread a contiguous run of words, exclusive scan of
  // the runs' bit counts.
  const int32_t per = (words + kPathThreads - 1) / kPathThreads;
  const int32_t w0 = min(words, t * per), w1 = min(words, w0 + per);
  uint32_t count = 0;
  for (int32_t w = w0; w < w1; ++w) count += __popc(bits[w]);
  scan[t] = count;
  __syncthreads();
  for (int32_t d = 1; d < kPathThreads; d *= 2) {
    const uint32_t v = t >= d ? scan[t - d] : 0u;
    __syncthreads();
    scan[t] += v;
    __syncthreads();
  }
  int32_t at = static_cast<int32_t>(scan[t] - count);
  for (int32_t w = w0; w < w1; ++w) {
    uint32_t x = bits[w];
    while (x != 0u) {
      const int32_t bit = __ffs(static_cast<int>(x)) - 1;
      x &= x - 1u;
      blocks[at++] = w * 32 + bit;
    }
  }
  if (t == 0) {
    // Only the newest block can be partial; it is always in when pinned.
    const bool newest = (bits[(nb - 1) / 32] >> ((nb - 1) % 32)) & 1u;
    p.entries[r] = PoolEntries(n, bs, k, newest);
  }
}

// ---- consumer: the pool's logits to the front of the row -----------------------
// One block per row whose pool holds more than topk entries; others are
// left (their answer is the whole pool, listed by the top-k). In place by
// rounds, as the block maxima: slot j reads position >= j (ascending
// distinct blocks).
__global__ void __launch_bounds__(kPathThreads) GatherPoolKernel(const PoolGatherParams p) {
  const int32_t r = blockIdx.x;
  const int32_t c = p.entries[r];
  if (c <= p.topk) return;
  const int32_t* blocks = p.blocks + static_cast<int64_t>(r) * p.topk_blocks;
  float* row = p.logits + static_cast<int64_t>(r) * p.stride;
  for (int32_t base = 0; base < c; base += kPathThreads) {
    const int32_t j = base + static_cast<int32_t>(threadIdx.x);
    const float v = j < c ? row[PoolSlotEntry(blocks, p.block_size, j)] : 0.f;
    __syncthreads();
    if (j < c) row[j] = v;
    __syncthreads();
  }
}

// ---- block path scores ------------------------------------------------------------
constexpr float kInitSentinel = 1e30f;
constexpr float kLocalSentinel = 1e29f;

// Block (page b, row r): score[h, r, b] = max over the visible entries of
// page b of scale * (q[r, h] . k[e]), fp32, d ascending as the cpu backend
// sums; init / local blocks take their sentinels. Row (h, r) of the scores
// holds `causal` valid blocks, recorded in p.causal for the top-k.
// Shared memory: q [Hi, D] fp32 | per-warp maxima [warps, Hi].
__global__ void __launch_bounds__(kPathThreads) BlockScoresKernel(const BlockScoreParams p) {
  extern __shared__ float sm[];
  const PageLayout& l = p.layout;
  const int32_t dim = l.head_dim, heads = p.num_heads;
  const int32_t lr = blockIdx.y, r = p.row_base + lr, b = blockIdx.x;
  const int32_t n = p.step.row_visible[r], per_page = l.page_entries;
  const int32_t causal = CeilDivD(n, per_page);
  if (b == 0) {
    for (int32_t h = threadIdx.x; h < heads; h += kPathThreads) p.causal[h * p.num_rows + lr] = causal;
  }
  if (b >= causal) return;
  const int32_t local_begin = max(0, causal - p.local_blocks);
  float forced = 0.f;
  if (b < min(causal, p.init_blocks)) {
    forced = kInitSentinel;
  } else if (b >= local_begin) {
    forced = kLocalSentinel;
  }
  if (forced != 0.f) {
    for (int32_t h = threadIdx.x; h < heads; h += kPathThreads) {
      p.scores[(static_cast<int64_t>(h) * p.num_rows + lr) * p.width + b] = forced;
    }
    return;
  }
  float* q_s = sm;                     // [heads, dim]
  float* wmax = sm + heads * dim;      // [kPathWarps, heads]
  for (int32_t i = threadIdx.x; i < heads * dim; i += kPathThreads) {
    q_s[i] = p.q[static_cast<int64_t>(lr) * heads * dim + i];
  }
  __syncthreads();
  const int32_t seq = p.step.row_seq[r];
  const int32_t* block_row = p.step.block_table + static_cast<int64_t>(seq) * p.step.max_pages;
  const int32_t e_end = min(n, (b + 1) * per_page);
  const int32_t lane = LaneId(), warp = WarpId();
  for (int32_t h = 0; h < heads; ++h) {
    float m = -INFINITY;
    const float* qh = q_s + h * dim;
    for (int32_t e = b * per_page + static_cast<int32_t>(threadIdx.x); e < e_end; e += kPathThreads) {
      const EntryRef ref = LocateEntry(l, p.pool, block_row, e);
      float acc = 0.f;
      for (int32_t blk = 0; blk < dim / kMxBlock; ++blk) {
        const float s = format_internal::ExactPow2(static_cast<int32_t>(ref.page[l.ScaleOffset(ref.e, blk)]) - 127);
        for (int32_t i = 0; i < kMxBlock; i += 2) {
          const int32_t d = blk * kMxBlock + i;
          const uint8_t byte = ref.page[l.ValueOffset(ref.e, d / 2)];
          acc = fmaf(qh[d], DecodeE2m1(byte & 0xf) * s, acc);
          acc = fmaf(qh[d + 1], DecodeE2m1(static_cast<uint8_t>(byte >> 4)) * s, acc);
        }
      }
      m = fmaxf(m, acc * p.scale);
    }
    for (int32_t d = kWarpSize / 2; d > 0; d /= 2) m = fmaxf(m, ShflXor(m, d));
    if (lane == 0) wmax[warp * heads + h] = m;
  }
  __syncthreads();
  for (int32_t h = threadIdx.x; h < heads; h += kPathThreads) {
    float m = wmax[h];
    for (int32_t w = 1; w < kPathWarps; ++w) m = fmaxf(m, wmax[w * heads + h]);
    p.scores[(static_cast<int64_t>(h) * p.num_rows + lr) * p.width + b] = m;
  }
}


// ---- block top-k --------------------------------------------------------------
// Warp (h, r): the top `topk` of the row's `causal` scores. Their order keys
// (larger float -> larger key) stay in registers, kSlots per lane (a
// template constant: every loop unrolls with no branch around a ballot);
// the threshold T (the topk-th largest key) is found from the top, two
// bits a step below the bits every real key shares, counting keys >= a
// candidate with ballots; then every key > T and the first keys == T
// (index order) up to topk are written.
constexpr int kBtMaxSlots = 32;

__device__ __forceinline__ uint32_t OrderKey(float x) {
  const uint32_t u = __float_as_uint(x);
  return (u & 0x80000000u) != 0u ? ~u : (u | 0x80000000u);
}

template <int kSlots>
__global__ void __launch_bounds__(kPathThreads) BlockTopkKernel(const BlockTopkParams p) {
  const int64_t item = static_cast<int64_t>(blockIdx.x) * kPathWarps + WarpId();  // h * rows + r
  if (item >= static_cast<int64_t>(p.num_heads) * p.num_rows) return;  // whole warps
  const int lane = LaneId();
  const int32_t causal = p.causal[item], k = p.topk;
  int32_t* out = p.out + item * k;
  if (causal <= k) {
    for (int32_t i = lane; i < k; i += kWarpSize) out[i] = i < causal ? i : -1;
    return;
  }
  const float* row = p.scores + item * p.width;
  // The row's scores are loaded beside `causal` (below the width, not the
  // causal count: no load waits on another), then masked.
  float v[kSlots];
#pragma unroll
  for (int s = 0; s < kSlots; ++s) {
    const int32_t i = s * kWarpSize + lane;
    v[s] = i < p.width ? row[i] : 0.f;
  }
  uint32_t key[kSlots];
  uint32_t any = 0u, all = ~0u;  // OR and AND of the real keys
#pragma unroll
  for (int s = 0; s < kSlots; ++s) {
    const bool real = s * kWarpSize + lane < causal;
    key[s] = real ? OrderKey(v[s]) : 0u;  // 0: below every real key
    any |= key[s];
    all &= real ? key[s] : ~0u;
  }
  for (int d = 1; d < kWarpSize; d *= 2) {
    any |= ShflXor(any, d);
    all &= ShflXor(all, d);
  }
  // Every real key (so the threshold too) shares the bits above the
  // highest bit where two of them differ: the search starts below them,
  // two bits a step (three independent counts), not 32 dependent steps.
  const uint32_t diff = any ^ all;
  int bit = diff == 0u ? -1 : 31 - __clz(static_cast<int>(diff));
  uint32_t thr = bit < 0 ? all : bit >= 31 ? 0u : all & ~((2u << bit) - 1u);
  auto count = [&](uint32_t cand) {
    int32_t cnt = 0;
#pragma unroll
    for (int s = 0; s < kSlots; ++s) cnt += PopCount64(Ballot(key[s] >= cand));
    return cnt;
  };
#pragma unroll 1
  for (; bit >= 1; bit -= 2) {
    const uint32_t hi = 1u << bit, lo = 1u << (bit - 1);
    const int32_t n_both = count(thr | hi | lo), n_hi = count(thr | hi), n_lo = count(thr | lo);
    thr |= n_both >= k ? hi | lo : n_hi >= k ? hi : n_lo >= k ? lo : 0u;
  }
  if (bit == 0 && count(thr | 1u) >= k) thr |= 1u;
  // thr >= 1: more than k real keys are >= 1, so no padding key is chosen.
  const uint64_t below = LanesBelow();
  int32_t pos = 0;
#pragma unroll
  for (int s = 0; s < kSlots; ++s) {
    const bool gt = key[s] > thr;
    const uint64_t m = Ballot(gt);
    if (gt) out[pos + PopCount64(m & below)] = s * kWarpSize + lane;
    pos += PopCount64(m);
  }
#pragma unroll
  for (int s = 0; s < kSlots; ++s) {
    const bool eq = key[s] == thr;
    const uint64_t m = Ballot(eq);
    const int32_t rank = PopCount64(m & below);
    if (eq && pos + rank < k) out[pos + rank] = s * kWarpSize + lane;
    pos = min(k, pos + PopCount64(m));
  }
}

}  // namespace

int32_t BlockTopkMaxWidth() { return kBtMaxSlots * kWarpSize; }

absl::Status LaunchBlockTopk(const BlockTopkParams& p, Stream stream) {
  const int64_t items = static_cast<int64_t>(p.num_heads) * p.num_rows;
  if (items == 0 || p.topk == 0) return absl::OkStatus();
  if (p.width > BlockTopkMaxWidth()) {
    return absl::InvalidArgumentError(absl::StrCat(
        "block top-k width: expected at most ", BlockTopkMaxWidth(), " blocks, got ", p.width));
  }
  const unsigned blocks = static_cast<unsigned>((items + kPathWarps - 1) / kPathWarps);
  if (p.width <= 8 * kWarpSize) {
    GPU_LAUNCH(BlockTopkKernel<8>, blocks, kPathThreads, 0, stream, p);
  } else if (p.width <= 16 * kWarpSize) {
    GPU_LAUNCH(BlockTopkKernel<16>, blocks, kPathThreads, 0, stream, p);
  } else {
    GPU_LAUNCH(BlockTopkKernel<kBtMaxSlots>, blocks, kPathThreads, 0, stream, p);
  }
  return absl::OkStatus();
}

absl::Status LaunchBlockMaxima(const BlockMaxParams& p, int32_t max_blocks, Stream stream) {
  if (p.num_rows == 0) return absl::OkStatus();
  if (p.maxima == nullptr) {
    GPU_LAUNCH(BlockMaximaKernel, p.num_rows, kPathThreads, 0, stream, p);
    return absl::OkStatus();
  }
  if (p.maxima_stride < max_blocks || p.maxima_stride % 4 != 0) {
    return absl::InvalidArgumentError(absl::StrCat("block maxima: expected a stride of >= ", max_blocks,
                                                   " floats, a multiple of 4, got ", p.maxima_stride));
  }
  const dim3 grid(static_cast<unsigned>(std::max<int32_t>(1, (max_blocks + kPathThreads - 1) / kPathThreads)),
                  static_cast<unsigned>(p.num_rows));
  GPU_LAUNCH(BlockMaximaSpreadKernel, grid, kPathThreads, 0, stream, p);
  return absl::OkStatus();
}

absl::Status LaunchFinishPool(const PoolParams& p, int32_t max_blocks, Stream stream) {
  if (p.num_rows == 0) return absl::OkStatus();
  const int64_t smem = (static_cast<int64_t>(max_blocks) + 31) / 32 * 4;
  if (smem > 160 * 1024) {
    return absl::InvalidArgumentError(absl::StrCat(
        "candidate blocks per row: expected at most ", 160 * 1024 * 8, ", got ", max_blocks));
  }
  GPU_RETURN_IF_ERROR(SetMaxDynamicSmem(&FinishPoolKernel, static_cast<int>(smem)));
  GPU_LAUNCH(FinishPoolKernel, p.num_rows, kPathThreads, smem, stream, p);
  return absl::OkStatus();
}

absl::Status LaunchGatherPool(const PoolGatherParams& p, Stream stream) {
  if (p.num_rows == 0) return absl::OkStatus();
  GPU_LAUNCH(GatherPoolKernel, p.num_rows, kPathThreads, 0, stream, p);
  return absl::OkStatus();
}

absl::Status LaunchBlockScores(const BlockScoreParams& p, Stream stream) {
  if (p.num_rows == 0 || p.width == 0) return absl::OkStatus();
  if (p.num_rows > 65535) {
    return absl::InvalidArgumentError(absl::StrCat(
        "block path rows per launch: expected at most 65535, got ", p.num_rows));
  }
  const int64_t smem = (static_cast<int64_t>(p.num_heads) * p.layout.head_dim +
                        static_cast<int64_t>(kPathWarps) * p.num_heads) * 4;
  if (smem > 160 * 1024) {
    return absl::InvalidArgumentError(absl::StrCat(
        "q.num_heads: the block path expected Hi x D fp32 within 160 KiB, got Hi ", p.num_heads));
  }
  GPU_RETURN_IF_ERROR(SetMaxDynamicSmem(&BlockScoresKernel, static_cast<int>(smem)));
  const dim3 grid(static_cast<unsigned>(p.width), static_cast<unsigned>(p.num_rows));
  GPU_LAUNCH(BlockScoresKernel, grid, kPathThreads, smem, stream, p);
  return absl::OkStatus();
}

}  // namespace gpu
}  // namespace indexer

// MiniMax-M3 block scores (SPEC §5 block path) as a persistent streaming
// kernel, sm_90:
//   score[h, r, b] = max over the visible entries e of page b of
//                    scale * (q[r, h] . k[e])
// with the init / local sentinels of the portable BlockScoresKernel.
//
// Why this shape. With Hi = 4 the multiply is small (8 m16n8k16 per 16
// entries); the kernel is bound by K's bytes and by the instructions that
// turn e2m1 into fp16. So: whole pages come by bulk copies (cp.async.bulk,
// one instruction per page) into a ring of kSwStages pages per group of
// warps (below), the next pages in flight while one is scored; the e2m1 -> fp16
// widening is 11 integer instructions per 8 values (below); each page's
// 512 e8m0 scales are turned into floats once per page, not once per lane.
// Pages are read once per step: the copies carry the L2 evict-first hint
// (knob INDEXER_GPU_WS_EVICT_FIRST=0 drops it), so that streaming K
// displaces its own lines rather than what other kernels left in L2.
//
// Bank conflicts (kTma). A lane reads 4 bytes of each 16-byte block chunk j
// of its entries g and g + 8; entries are 64 bytes apart, so entries g and
// g + 2 share banks and a plain page copy makes every value load a 4-way
// conflict. Pools of linear pages have a tensor map (BlockPoolWantsTensorMap)
// whose box is one page's values in the 64-byte swizzle: chunk j of entry e
// lands at chunk j ^ ((e >> 1) & 3) of its row (the ring slots 1024-byte
// aligned), so the 8 entries of a load take 8 different chunk columns and
// the warp's 32 words 32 banks. The page's scales follow by a bulk copy.
//
// Arithmetic (as block_scores_mma.cu): Q is fp32; per (head, block j) it is
// scaled by 2^(14 - E_j) (E_j the exponent of the block's largest |q|) and
// split into two fp16 parts hi + lo (|q' - hi - lo| <= 2^-22 |q'| for
// normal parts). An e2m1 nibble s.e1e0.m placed at fp16 bits 15 and 11..9
// is exactly its value times 2^-14, so one mma chain per block gives
// P_j = sum (hi + lo) * k * 2^-14 = 2^-E_j sum q k_e2m1 with fp32
// accumulation; dot = sum_j P_j * 2^(ek_j - 127) * 2^E_j. With head_lanes
// (below) E_j is the row's, over every head (SwLoadQ), and each page's
// scale pass multiplies 2^E_j into the entries' block scales.
//
// Columns: n8 tile nt holds heads 4 nt .. 4 nt + 3, columns 0-3 their hi
// parts and 4-7 their lo parts; lanes t and t ^ 2 add a head's parts.
// Shapes with head_lanes (the default for Hi <= 4) put head 4 nt + i in
// columns 2i (hi) and 2i + 1 (lo) instead, so that lane (g, t) holds both
// parts of head 4 nt + t: the parts added in the lane (4 shuffles fewer
// per tile), one maximum per head to combine, not two, and the Q factors
// one per (row, block), folded into the scales (no multiply in the tile).
// Lane (g, t) holds the bytes 4t..4t+3 of each block j of rows g and g + 8
// (its 8 elements 32 j + 8 t + i): the even elements i feed k-step 2 j, the
// odd ones k-step 2 j + 1, with Q's B fragments in the same order.
//
// Work: the step's work map (BlockWorkMap) splits the flat (row, page) items
// of the launch evenly over the CTAs; group w of a CTA (page_warps warps)
// takes items first + w, first + w + groups, ..., so that B = 1 long rows
// and B = 128 short rows alike fill the device. Per item each warp of the
// group scores its tiles of the page; one warp (a group of one) writes the
// Hi block scores directly, a larger group puts its warps' maxima in shared
// memory and its first warp writes their maximum after the group's named
// barrier. Forced (init / local) pages are not read.
#include "kernels/gpu/gpu_compat.h"  // first: the runtime defines __device__ & co.

#include <algorithm>
#include <cstdlib>
#include <type_traits>
#include <utility>

#include "absl/strings/str_cat.h"
#include "kernels/format/fp8.h"
#include "kernels/format/mxfp4.h"
#include "kernels/gpu/hopper/mma_sm90.h"
#include "kernels/gpu/hopper/trace_sm90.h"
#include "kernels/gpu/hopper/wgmma_sm90.h"
#include "kernels/gpu/knobs.h"
#include "kernels/gpu/paged.h"
#include "kernels/gpu/params.h"

namespace indexer {
namespace gpu {
namespace {

// Launch shapes {warps per CTA, ring pages per group, CTAs per SM, warps
// per page}: all within the 227 KiB of shared memory an SM offers at
// 128-entry pages. A group of page_warps warps scores one page together,
// each warp a contiguous share of its 16-entry tiles; the group's first
// warp fetches. The kernel is bound by the latency of each warp's chains
// (ncu at shape 2: issue slots 46 % busy, DRAM 44 %), so more warps per SM
// is what pays, and two warps per page keep the ring (the groups' pages
// in flight) as deep as before. Shape 4 (20 warps in 10 groups of 2, 96
// registers; ptxas of CUDA 13 spills 16 bytes on the tensor-map path and 56
// on tiled pages): on the H200, same call, B=64 x 32k / B=128 x 128k /
// prefill 4k x 32k logits 75.4 / 418.1 / 2984 us against 80.2 / 461.8 / 3298
// at shape 2 (one warp per page, 11 warps), 76.2 / 435.4 / 3110 at shape 3;
// 22 or 24 warps spill and lose (79.4 / 453.9 at 22), 18 warps lose (78.2 /
// 460.4), and a third ring page at 20 or 24 warps no longer fits 128-entry
// pages. The default for Hi <= 4 is shape 5, shape 4 with head_lanes (92-96
// registers, no spills; 147 instructions per tile against 165, ncu): on the
// H200 (s24, two rounds each) logits B=64 x 32k 66.5 against 71.7 us, B=128
// x 32k 108.1 / 117.4, B=64 x 128k 196.3 / 213.2, B=128 x 128k 366.1 /
// 402.3, prefill 4k x 32k 2641 / 2901, B=1 within 0.8 us either way. (On an
// H100, three calls of the same session, it won the prefill by 150-300 us
// and lost up to 8.7 us on decode at B >= 64, most at B=128 x 128k: up to
// 2.5 %.) Groups of four warps with a ring of 3-4 pages each (shapes 5-7 and
// 9 of s23/s24's runs) lost everywhere: B=64 x 32k +6.6 to +10.0 us on the
// H200, +4.4 and +7.8 on the H100. Nor does dropping the group's barrier per
// page pay (ncu: 8 % of the warps' samples wait there): with each warp
// counting itself done with an item in shared memory and the last one
// combining and refilling the slot (ad8ef28, reverted), logits moved -3.4 to
// +1.1 us on decode and +70 us on prefill (H100, s24, three rounds), and
// racecheck reported 15 hazards on the counter handoff. Nor do waves pay
// (04044d1, reverted): ncu puts the SMs' active cycles at 84.5k to 104k
// (average 92k) at B=64 x 32k with every CTA holding the same pages, but a
// grid of 2 or 4 times the resident CTAs, so that slower SMs would run
// fewer, moved logits -1.9 to +2.8 us at B >= 64 and +2 to +4 at B = 1
// (H100, s30, two rounds; 10-warp CTAs two per SM, or shape 5's CTAs in
// two waves). Hi 5-8 (two n8 tiles, not a shipped profile) keeps shape 2:
// shape 4 spills ~250 bytes there. The INDEXER_GPU_BLOCK_STREAM knob
// (knobs.h) picks a shape for comparison.
struct SwShape {
  int warps, stages, ctas_per_sm;
  int page_warps;  // warps scoring one page together (a group)
  bool head_lanes = false;  // a head's hi and lo columns in one lane (above)
};
constexpr SwShape kSwShapes[] = {{4, 3, 2, 1},  {5, 2, 2, 1},  {11, 2, 1, 1}, {16, 3, 1, 2},
                                 {20, 2, 1, 2}, {20, 2, 1, 2, true}};
constexpr int kSwShapeCount = static_cast<int>(sizeof(kSwShapes) / sizeof(kSwShapes[0]));
constexpr int kSwDefaultShape = 5, kSwDefaultShapeTwoTiles = 2;
static_assert(kSwShapes[kSwDefaultShape].ctas_per_sm == kSwShapes[kSwDefaultShapeTwoTiles].ctas_per_sm,
              "the work map's CTA count does not depend on Hi");
constexpr int kSwDim = 128;            // D
constexpr int kSwMaxEntries = 128;     // E (one page's scales staged as float4)
constexpr int kSwMaxHeads = 8;         // two n8 tiles
constexpr float kSwInitSentinel = 1e30f;   // as BlockScoresKernel
constexpr float kSwLocalSentinel = 1e29f;
static_assert(kSwDim == 4 * kMxBlock, "four MXFP4 blocks of 32 per entry");

constexpr int kSwMaxPageWarps = 2;

// Shared memory of one group (the warps of one page): its page ring, the
// scored page's scales as floats, the warps' block maxima (two buffers,
// alternate items), one mbarrier per ring slot. With the tensor map (tma)
// the ring is two: the slots' values (E x 64 bytes each, a multiple of
// 1024: the swizzle's pattern comes from the address bits) and then their
// raw scales (E x 4 bytes each); the group's share is a multiple of 1024
// from a 1024-byte aligned base. Without it a slot holds the whole page.
struct SwGroupSmem {
  int64_t page_stride;  // tma: the values' slot stride; else page bytes rounded up to 128
  int64_t raw_at;       // tma: the raw scales' ring (slot stride raw_stride); else 0
  int64_t raw_stride;
  int64_t scales_at;    // float4 [E rounded up to 16]
  int64_t comb_at;      // float [2][kSwMaxPageWarps][kSwMaxHeads]
  int64_t bars_at;      // uint64 [stages]
  int64_t bytes;        // the group's share, a multiple of 128 (tma: of 1024)
};
__host__ __device__ inline SwGroupSmem SwSmemOf(int64_t page_bytes, int32_t page_entries, int stages,
                                                bool tma) {
  SwGroupSmem s;
  const int64_t values = static_cast<int64_t>(page_entries) * (kSwDim / 2);
  s.page_stride = tma ? values : (page_bytes + 127) / 128 * 128;
  s.raw_at = tma ? stages * s.page_stride : 0;
  s.raw_stride = tma ? page_bytes - values : 0;
  s.scales_at = tma ? s.raw_at + stages * s.raw_stride : stages * s.page_stride;
  s.comb_at = s.scales_at + static_cast<int64_t>((page_entries + 15) / 16 * 16) * 16;
  s.bars_at = s.comb_at + 2 * kSwMaxPageWarps * kSwMaxHeads * 4;
  const int64_t align = tma ? 1024 : 128;
  s.bytes = (s.bars_at + 8 * stages + align - 1) / align * align;
  return s;
}

#if INDEXER_GPU_WGMMA
// 2^(x - 127) of an e8m0 byte x < 255 (checked at input), as the float's
// bits, from a word holding x at bits 23..30 (other bits anything): normal
// for x >= 1, the subnormal 2^-127 (0x00400000) for 0, which is what the
// unsigned maximum gives. Three instructions a byte (shift, mask, max);
// each byte of a scale word shifted into place, not extracted first.
__device__ __forceinline__ float SwE8m0At23(uint32_t w) {
  return __uint_as_float(max(w & 0x7f800000u, 0x00400000u));
}
// The four e8m0 bytes of s (block j in byte j) as floats.
__device__ __forceinline__ float4 SwE8m0x4(uint32_t s) {
  return make_float4(SwE8m0At23(s << 23), SwE8m0At23(s << 15), SwE8m0At23(s << 7), SwE8m0At23(s >> 1));
}

// One row's walk state: the row holding flat item f and its geometry.
struct SwCursor {
  int32_t f;           // flat item
  int32_t r;           // its row (step numbering)
  int32_t start, next; // starts[r], starts[r + 1]
  int32_t n, causal;   // visible entries, causal pages
  const int32_t* block_row;  // the row's sequence's block table
};

// Moves c to the row of c.f; items at or past f_end (the CTA's end) stay
// on the last row reached (starts[] ends there).
__device__ __forceinline__ void SwAdvance(const int32_t* starts, const DeviceStepRows& step,
                                          int32_t per_page, int32_t f_end, SwCursor& c) {
  bool moved = false;
  while (c.f < f_end && c.f >= c.next) {
    ++c.r;
    c.start = c.next;
    c.next = starts[c.r + 1];
    moved = true;
  }
  if (moved) {
    c.n = step.row_visible[c.r];
    c.causal = (c.n + per_page - 1) / per_page;
    c.block_row = step.block_table + static_cast<int64_t>(step.row_seq[c.r]) * step.max_pages;
  }
}

// Forced pages (sentinels) are scored without reading K.
__device__ __forceinline__ float SwForced(int32_t b, int32_t causal, int32_t init, int32_t local) {
  return b < min(causal, init) ? kSwInitSentinel : b >= max(0, causal - local) ? kSwLocalSentinel : 0.f;
}

// Row lr's Q in this lane's B fragments (column g of each tile, every
// k-step) and the Q factors 2^E_j of its accumulator columns 2t, 2t + 1
// (kHeadLanes: both are head 4 nt + t's, f1 = f0).
//
// kHeadLanes: E_j is the exponent of block j's largest |q| over every head
// of the row, not per head, so that 2^E_j is one factor per (row, block),
// the same in every lane: the page's scale pass folds it into the entries'
// block scales once per entry, instead of one multiply per head, block and
// row a tile (8 a tile). A head whose block j is 2^k times smaller than the
// row's largest keeps its hi + lo split exact to 2^-22 of its own values
// for k <= 17 (below that lo turns subnormal in fp16: an error of at most
// 2^-39 of the row's largest |q| a value, by that bound inside SPEC §5's
// summation-order tolerance for heads up to 2^20 apart; gpu_paths_test
// also has heads 2^21 apart).
template <int kNT, bool kHeadLanes>
__device__ __forceinline__ void SwLoadQ(const BlockScoreParams& p, int32_t lr, int g, int t,
                                        uint2 (&bq)[kNT][8], float (&f0)[kNT][4],
                                        float (&f1)[kNT][4]) {
  const bool lo_part = kHeadLanes ? (g & 1) != 0 : g >= 4;
  // The lane's 8 values of head h, block j (0 for a head past num_heads).
  auto load = [&](int h, int j, float (&x)[8]) {
    if (h < p.num_heads) {
      const float4* src = reinterpret_cast<const float4*>(
          p.q + (static_cast<int64_t>(lr) * p.num_heads + h) * kSwDim + 32 * j + 8 * t);
      const float4 a = src[0], b = src[1];
      x[0] = a.x, x[1] = a.y, x[2] = a.z, x[3] = a.w, x[4] = b.x, x[5] = b.y, x[6] = b.z, x[7] = b.w;
    } else {
#pragma unroll
      for (int i = 0; i < 8; ++i) x[i] = 0.f;
    }
  };
  auto head_of = [&](int nt) { return nt * 4 + (kHeadLanes ? g >> 1 : g & 3); };
  // kHeadLanes: block j's largest |q| over every head of the row (every
  // lane's values, every n8 tile).
  float row_max[4] = {0.f, 0.f, 0.f, 0.f};
  if constexpr (kHeadLanes) {
#pragma unroll
    for (int nt = 0; nt < kNT; ++nt) {
#pragma unroll
      for (int j = 0; j < 4; ++j) {
        float x[8];
        load(head_of(nt), j, x);
#pragma unroll
        for (int i = 0; i < 8; ++i) row_max[j] = fmaxf(row_max[j], fabsf(x[i]));
      }
    }
#pragma unroll
    for (int j = 0; j < 4; ++j) {
#pragma unroll
      for (int o = 1; o < 32; o <<= 1) row_max[j] = fmaxf(row_max[j], ShflXor(row_max[j], o));
    }
  }
#pragma unroll
  for (int nt = 0; nt < kNT; ++nt) {
    const int h = head_of(nt);
    float ef[4];
#pragma unroll
    for (int j = 0; j < 4; ++j) {
      float x[8];
      load(h, j, x);
      float m = row_max[j];
      if constexpr (!kHeadLanes) {
#pragma unroll
        for (int i = 0; i < 8; ++i) m = fmaxf(m, fabsf(x[i]));
        m = fmaxf(m, ShflXor(m, 1));
        m = fmaxf(m, ShflXor(m, 2));
      }
      // E: the exponent of the block's largest |q| (0 for an all-zero
      // block), in [-126, 127] so that 2^E and 2^-E are exact floats.
      const int32_t biased = static_cast<int32_t>((__float_as_uint(m) >> 23) & 0xffu);
      const int32_t e = m == 0.f ? 0 : max(biased - 127, -126);
      const float down = format_internal::ExactPow2(-e);
      uint32_t part[8];
#pragma unroll
      for (int i = 0; i < 8; ++i) {
        const float y = x[i] * down * 16384.f;  // |y| < 2^15: fp16 holds it
        const uint16_t hi = F32ToF16Rn(y);
        part[i] = lo_part ? F32ToF16Rn(y - F16ToF32(hi)) : hi;
      }
      bq[nt][2 * j] = make_uint2(part[0] | part[2] << 16, part[4] | part[6] << 16);
      bq[nt][2 * j + 1] = make_uint2(part[1] | part[3] << 16, part[5] | part[7] << 16);
      ef[j] = format_internal::ExactPow2(e);
    }
    // Column c's Q is held by the lanes g = c (kHeadLanes: the row's factor,
    // the same in every lane).
#pragma unroll
    for (int j = 0; j < 4; ++j) {
      f0[nt][j] = kHeadLanes ? ef[j] : ShflIdx(ef[j], 8 * t);
      f1[nt][j] = kHeadLanes ? ef[j] : ShflIdx(ef[j], 8 * t + 4);
    }
  }
}

// Two 4-byte shared-memory loads at a shared-window address and 512 bytes
// on (rows e and e + 8 of a swizzled slot; the reads XOR their chunk into
// the address). Volatile: never moved above the slot's mbarrier wait.
__device__ __forceinline__ void SwLdsPair(uint32_t addr, uint32_t& a, uint32_t& b) {
  asm volatile("ld.shared.u32 %0, [%2];\n\tld.shared.u32 %1, [%2+512];\n" : "=r"(a), "=r"(b) : "r"(addr));
}

// Eight e2m1 nibbles of w (element i in nibble i) as the fp16 high bytes of
// value * 2^-14: even elements in `even` (byte i = element 2i), odd ones in
// `odd`. A byte s000mmm0 is the high byte of the half with sign s and bits
// 11..9 = e1 e0 m.
__device__ __forceinline__ void SwSplitE2m1(uint32_t w, uint32_t& even, uint32_t& odd) {
  even = ((w << 1) & 0x0e0e0e0eu) | ((w << 4) & 0x80808080u);
  odd = ((w >> 3) & 0x0e0e0e0eu) | (w & 0x80808080u);
}
// Bytes 0, 1 (`sel` 0x1404) or 2, 3 (0x3424) of `bytes` as the high bytes of
// two halves (low bytes 0).
__device__ __forceinline__ uint32_t SwHalves(uint32_t bytes, uint32_t sel) {
  return __byte_perm(bytes, 0u, sel);
}
#endif  // INDEXER_GPU_WGMMA

template <int kNT, bool kTiled, bool kTma, int kShape>
__global__ void __launch_bounds__(kSwShapes[kShape].warps * 32, kSwShapes[kShape].ctas_per_sm)
    BlockScoresStreamKernel(const INDEXER_GRID_CONSTANT BlockScoreParams p, const BlockWorkMap wm) {
#if INDEXER_GPU_WGMMA
  static_assert(!(kTiled && kTma), "the tensor map is for linear pages");
  constexpr int kSwWarps = kSwShapes[kShape].warps, kSwThreads = kSwWarps * 32;
  constexpr int kSwStages = kSwShapes[kShape].stages;
  constexpr int kPW = kSwShapes[kShape].page_warps, kGroups = kSwWarps / kPW;
  constexpr bool kHL = kSwShapes[kShape].head_lanes;
  static_assert(kSwStages >= 2, "one page scored while the next arrives");
  static_assert(kPW >= 1 && kPW <= kSwMaxPageWarps && kSwWarps % kPW == 0, "whole groups");
  static_assert(kGroups <= 15, "a named barrier per group (ids 1..15)");
  extern __shared__ __align__(128) uint8_t sw_smem_raw[];
  // tma: the launch adds 1024 bytes of slack for this alignment.
  uint8_t* const sw_smem = kTma ? AlignSmem1024(sw_smem_raw) : sw_smem_raw;
  const PageLayout& l = p.layout;
  const int32_t per_page = l.page_entries;
  const uint32_t page_bytes = static_cast<uint32_t>(l.page_bytes());
  const SwGroupSmem lay = SwSmemOf(page_bytes, per_page, kSwStages, kTma);
  const int warp = WarpId(), lane = LaneId(), g = lane / 4, t = lane % 4;
  const int group = warp / kPW, sub = warp % kPW;  // sub: the warp's part of the page
  uint8_t* const my = sw_smem + group * lay.bytes;
  // tma: chunk j of row e lands at e * 64 + ((j ^ ((e >> 1) & 3)) << 4) of
  // the slot. For this lane's rows e0 + g and e0 + g + 8 (e0 a multiple of
  // 16) that is e0 * 64 + (lane_sw ^ (j << 4)) and 512 bytes on.
  const uint32_t lane_sw = static_cast<uint32_t>((g * (kSwDim / 2) + 4 * t) ^ (((g >> 1) & 3) << 4));
  float4* const sc = reinterpret_cast<float4*>(my + lay.scales_at);
  float* const comb = reinterpret_cast<float*>(my + lay.comb_at);
  uint64_t* const bars = reinterpret_cast<uint64_t*>(my + lay.bars_at);
  // The warp's entries of a page: [lo, lo + span), whole 16-entry tiles.
  const int32_t span = (per_page + 16 * kPW - 1) / (16 * kPW) * 16, lo = sub * span;
  // The bench's timeline (trace_sm90.h): thread 0, the first group's first
  // warp's lane 0 (its fetcher and one of its scorers); null otherwise and
  // untraced.
  auto trace = [&]() { return threadIdx.x == 0 ? TraceRecord(p.trace, p.trace_blocks) : nullptr; };
  TraceEntry(trace());

  // Causal pages per (head, row) for the top-k: a grid-strided pass.
  for (int32_t i = blockIdx.x * kSwThreads + threadIdx.x; i < p.num_rows; i += wm.ctas * kSwThreads) {
    const int32_t causal = (p.step.row_visible[p.row_base + i] + per_page - 1) / per_page;
    for (int32_t h = 0; h < p.num_heads; ++h) p.causal[h * p.num_rows + i] = causal;
  }

  if (sub == 0 && lane == 0) {
    for (int s = 0; s < kSwStages; ++s) MbarInit(&bars[s], 1);
    FenceMbarInit();
  }
  if constexpr (kPW == 1) {
    __syncwarp();
  } else {
    __syncthreads();  // the group's barriers, initialized by its first warp
  }

  const int32_t* cta = wm.cta + 2 * blockIdx.x;
  const int32_t f_end = cta[2];
  // Producer cursor (the next item to fetch) and consumer cursor (the item
  // scored), both starting at the CTA's first row.
  SwCursor pc;
  pc.f = cta[0] + group;
  pc.r = cta[1];
  pc.start = wm.starts[pc.r];
  pc.next = wm.starts[pc.r + 1];
  pc.n = p.step.row_visible[pc.r];
  pc.causal = (pc.n + per_page - 1) / per_page;
  pc.block_row = p.step.block_table + static_cast<int64_t>(p.step.row_seq[pc.r]) * p.step.max_pages;
  SwAdvance(wm.starts, p.step, per_page, f_end, pc);
  SwCursor cc = pc;
  const int64_t head_stride = static_cast<int64_t>(p.num_rows) * p.width;

  // The producer runs one item ahead of its copies: the page id of the
  // item it copies next is read an iteration before (no dependent global
  // load in front of each copy). page < 0: nothing to copy (past the CTA's
  // range, or a forced page).
  auto page_of = [&](const SwCursor& c) -> int32_t {
    if (c.f >= f_end) return -1;
    const int32_t b = c.f - c.start;
    return SwForced(b, c.causal, p.init_blocks, p.local_blocks) == 0.f ? c.block_row[b] : -1;
  };
  auto copy = [&](int32_t page, int slot) {
    if (page >= 0 && sub == 0 && lane == 0) {
      // The slot's last readers (the group's lanes, generic proxy: they
      // passed the group's barrier) before the copy engine's write.
      FenceProxyAsyncShared();
      MbarArriveExpectTx(&bars[slot], page_bytes);
      const uint8_t* src = p.pool + l.PageOffset(page);
      if constexpr (kTma) {
        const uint32_t raw_bytes = static_cast<uint32_t>(lay.raw_stride);
        uint8_t* const raw_dst = my + lay.raw_at + slot * lay.raw_stride;
        if (p.evict_first) {
          TmaLoad3dHint(my + slot * lay.page_stride, &p.tmap, 0, 0, page, &bars[slot], kL2EvictFirst);
          BulkLoadHint(raw_dst, src + l.scale_region(), raw_bytes, &bars[slot], kL2EvictFirst);
        } else {
          TmaLoad3d(my + slot * lay.page_stride, &p.tmap, 0, 0, page, &bars[slot]);
          BulkLoad(raw_dst, src + l.scale_region(), raw_bytes, &bars[slot]);
        }
      } else if (p.evict_first) {
        BulkLoadHint(my + slot * lay.page_stride, src, page_bytes, &bars[slot], kL2EvictFirst);
      } else {
        BulkLoad(my + slot * lay.page_stride, src, page_bytes, &bars[slot]);
      }
    }
  };
  auto step_on = [&](SwCursor& c) {
    c.f += kGroups;
    SwAdvance(wm.starts, p.step, per_page, f_end, c);
  };
  // Knob INDEXER_GPU_BLOCK_PREFETCH: the page copied at the next item asked
  // of the L2 now, an item (one page's scoring) ahead of its copy: a second
  // page in flight per group beside the ring, without its shared memory.
  auto hint = [&](int32_t page) {
    if (p.l2_prefetch && page >= 0 && sub == 0 && lane == 0) BulkPrefetchL2(p.pool + l.PageOffset(page), page_bytes);
  };

  uint2 bq[kNT][8];
  float f0[kNT][4], f1[kNT][4];
  int32_t q_row = -1;
  // (Q's loads wait: ncu at B=64 x 32k puts 12 % of the warps' samples on
  // them, 4 % on pages. Asking for the first row's Q before the page
  // copies, and prefetching a row's Q into L1 when the copies reach it,
  // lost on an H100 (s24): +2.8 us at B=1 x 32k, +2.1 at B=64 x 32k, -1.2
  // at 128k.)

  // ---- prologue: the first kSwStages - 1 items in flight -------------------
#pragma unroll
  for (int s = 0; s < kSwStages - 1; ++s) {
    copy(page_of(pc), s);
    step_on(pc);
  }
  int32_t pending = page_of(pc);  // item kSwStages - 1
  step_on(pc);
  uint32_t phase = 0;  // bit s: parity of ring slot s's next completion
  const bool linear = !kTiled;

#pragma unroll 1
  for (int32_t k = 0; cc.f < f_end; ++k) {
    const int slot = k % kSwStages;
    copy(pending, (k + kSwStages - 1) % kSwStages);  // item k + kSwStages - 1
    pending = page_of(pc);                            // item k + kSwStages
    hint(pending);
    step_on(pc);
    const int32_t b = cc.f - cc.start, lr = cc.r - p.row_base;
    float* score0 = p.scores + static_cast<int64_t>(lr) * p.width + b;  // head 0
    const float forced = SwForced(b, cc.causal, p.init_blocks, p.local_blocks);
    if (forced != 0.f) {
      if (sub == 0 && lane < p.num_heads) score0[lane * head_stride] = forced;
    } else {
      if (cc.r != q_row) {
        SwLoadQ<kNT, kHL>(p, lr, g, t, bq, f0, f1);
        q_row = cc.r;
      }
      const int32_t count = min(per_page, cc.n - b * per_page);  // visible entries of the page
      const int32_t tiles16 = (count + 15) / 16 * 16;
      TraceMathWait(p.trace != nullptr, trace(), [&] { MbarWait(&bars[slot], (phase >> slot) & 1u); });
      phase ^= 1u << slot;
      const uint8_t* page = my + slot * lay.page_stride;
      const uint32_t page_s = kTma ? SmemAddr(page) : 0u;  // its shared-window address
      // The slot's scales: tma, the raw ring's slot (entry e at 4 e); else
      // the page's scale region.
      const uint8_t* raw = kTma ? my + lay.raw_at + slot * lay.raw_stride : page + l.scale_region();

      const int32_t hi = min(count, lo + span);  // this warp's visible entries end
      // ---- the warp's scales as floats (0 past the visible entries) -------
      for (int32_t e = lo + lane; e < min(tiles16, lo + span); e += 32) {
        float4 f = make_float4(0.f, 0.f, 0.f, 0.f);
        if (e < count) {
          uint32_t s;
          if (linear) {
            s = *reinterpret_cast<const uint32_t*>(raw + 4 * e);
          } else {
            s = 0;
#pragma unroll
            for (int j = 0; j < 4; ++j) s |= static_cast<uint32_t>(page[l.ScaleOffset(e, j)]) << (8 * j);
          }
          f = SwE8m0x4(s);
          if constexpr (kHL) {  // the row's Q factors (SwLoadQ), exact powers of 2
            f.x *= f0[0][0], f.y *= f0[0][1], f.z *= f0[0][2], f.w *= f0[0][3];
          }
        }
        sc[e] = f;
      }
      __syncwarp();

      // ---- 16-entry tiles --------------------------------------------------
      float mx[kNT][2];
#pragma unroll
      for (int nt = 0; nt < kNT; ++nt) mx[nt][0] = mx[nt][1] = -INFINITY;
      // One 16-entry tile at e0. kMasked: the tile may end past the page's
      // visible entries (those rows must not count); only a row's last page
      // has such a tile, so the others skip the checks (4 instructions a
      // tile).
      auto tile = [&](int32_t e0, auto masked) {
        constexpr bool kMasked = decltype(masked)::value;
        const int32_t ea = e0 + g, eb = e0 + g + 8;
        uint32_t wa[4], wb[4];
        if constexpr (kTma) {
          // The slot is 1024-byte aligned and e0 * 64 a multiple of 1024:
          // XOR-ing j into the address XORs it into the lane's chunk bits.
          const uint32_t sa = page_s + static_cast<uint32_t>(e0 * (kSwDim / 2)) + lane_sw;
#pragma unroll
          for (int j = 0; j < 4; ++j) SwLdsPair(sa ^ (j << 4), wa[j], wb[j]);
        } else if (linear) {
          const uint8_t* va = page + l.ValueOffset(ea, 4 * t);
          const uint8_t* vb = page + l.ValueOffset(eb, 4 * t);
#pragma unroll
          for (int j = 0; j < 4; ++j) {
            wa[j] = *reinterpret_cast<const uint32_t*>(va + 16 * j);
            wb[j] = *reinterpret_cast<const uint32_t*>(vb + 16 * j);
          }
        } else {
#pragma unroll
          for (int j = 0; j < 4; ++j) {
            wa[j] = *reinterpret_cast<const uint32_t*>(page + l.ValueOffset(ea, 16 * j + 4 * t));
            wb[j] = *reinterpret_cast<const uint32_t*>(page + l.ValueOffset(eb, 16 * j + 4 * t));
          }
        }
        const float4 ska = sc[ea], skb = sc[eb];
        const float ska_j[4] = {ska.x, ska.y, ska.z, ska.w};
        const float skb_j[4] = {skb.x, skb.y, skb.z, skb.w};
        float acc[kNT][4];
#pragma unroll
        for (int nt = 0; nt < kNT; ++nt) acc[nt][0] = acc[nt][1] = acc[nt][2] = acc[nt][3] = 0.f;
#pragma unroll
        for (int j = 0; j < 4; ++j) {
          uint32_t ae, ao, be, bo;
          SwSplitE2m1(wa[j], ae, ao);
          SwSplitE2m1(wb[j], be, bo);
          const uint32_t a0 = SwHalves(ae, 0x1404), a1 = SwHalves(be, 0x1404);
          const uint32_t a2 = SwHalves(ae, 0x3424), a3 = SwHalves(be, 0x3424);
          const uint32_t c0 = SwHalves(ao, 0x1404), c1 = SwHalves(bo, 0x1404);
          const uint32_t c2 = SwHalves(ao, 0x3424), c3 = SwHalves(bo, 0x3424);
#pragma unroll
          for (int nt = 0; nt < kNT; ++nt) {
            float d[4] = {0.f, 0.f, 0.f, 0.f};
            MmaF16(d, a0, a1, a2, a3, bq[nt][2 * j].x, bq[nt][2 * j].y);
            MmaF16(d, c0, c1, c2, c3, bq[nt][2 * j + 1].x, bq[nt][2 * j + 1].y);
            if constexpr (kHL) {  // the scales carry the row's Q factors (the scale pass)
              acc[nt][0] = fmaf(d[0], ska_j[j], acc[nt][0]);
              acc[nt][1] = fmaf(d[1], ska_j[j], acc[nt][1]);
              acc[nt][2] = fmaf(d[2], skb_j[j], acc[nt][2]);
              acc[nt][3] = fmaf(d[3], skb_j[j], acc[nt][3]);
            } else {
              acc[nt][0] = fmaf(d[0], ska_j[j] * f0[nt][j], acc[nt][0]);
              acc[nt][1] = fmaf(d[1], ska_j[j] * f1[nt][j], acc[nt][1]);
              acc[nt][2] = fmaf(d[2], skb_j[j] * f0[nt][j], acc[nt][2]);
              acc[nt][3] = fmaf(d[3], skb_j[j] * f1[nt][j], acc[nt][3]);
            }
          }
        }
        // hi + lo (lanes t, t ^ 2); rows past the page's visible entries
        // do not count (their scales are 0, their products 0, not -inf).
        const bool oka = !kMasked || ea < count, okb = !kMasked || eb < count;
#pragma unroll
        for (int nt = 0; nt < kNT; ++nt) {
          if constexpr (kHL) {  // hi + lo in the lane; mx[nt][0]: head 4 nt + t
            const float va = acc[nt][0] + acc[nt][1], vb = acc[nt][2] + acc[nt][3];
            mx[nt][0] = fmaxf(mx[nt][0], fmaxf(oka ? va : -INFINITY, okb ? vb : -INFINITY));
          } else {
#pragma unroll
            for (int c = 0; c < 4; ++c) acc[nt][c] += ShflXor(acc[nt][c], 2);
            mx[nt][0] = fmaxf(mx[nt][0], fmaxf(oka ? acc[nt][0] : -INFINITY, okb ? acc[nt][2] : -INFINITY));
            mx[nt][1] = fmaxf(mx[nt][1], fmaxf(oka ? acc[nt][1] : -INFINITY, okb ? acc[nt][3] : -INFINITY));
          }
        }
      };
      // The warp's whole tiles, two at a time (independent chains for the
      // scheduler), then the partial one if the visible entries end inside
      // a tile.
      const int32_t whole_end = lo + max(hi - lo, 0) / 16 * 16;
#pragma unroll 2
      for (int32_t e0 = lo; e0 < whole_end; e0 += 16) tile(e0, std::false_type{});
      if (whole_end < hi) tile(whole_end, std::true_type{});
      // Maxima over the 8 row lanes; lanes g = 0, t < 2 hold heads
      // 4 nt + 2t, + 1 (kHL: lanes g = 0 hold head 4 nt + t; -inf for a
      // warp past the visible entries). The scale is positive: applied to
      // the maximum.
      float* const mine = comb + ((k & 1) * kSwMaxPageWarps + sub) * kSwMaxHeads;
#pragma unroll
      for (int nt = 0; nt < kNT; ++nt) {
#pragma unroll
        for (int c = 0; c < (kHL ? 1 : 2); ++c) {
          float v = mx[nt][c];
          v = fmaxf(v, ShflXor(v, 4));
          v = fmaxf(v, ShflXor(v, 8));
          v = fmaxf(v, ShflXor(v, 16));
          const int h = kHL ? 4 * nt + t : 4 * nt + 2 * t + c;
          if (g == 0 && (kHL || t < 2) && h < p.num_heads) {
            if constexpr (kPW == 1) {
              score0[h * head_stride] = v * p.scale;
            } else {
              mine[h] = v;
            }
          }
        }
      }
    }
    if constexpr (kPW == 1) {
      // Every lane is done with the slot and the scales before either is
      // written again.
      __syncwarp();
    } else {
      // Every warp of the group is done with the slot (the next copy into
      // it follows) and has put its maxima in this item's buffer (the other
      // buffer is the next item's: a warp cannot reach it again before the
      // first warp has passed this barrier's next round).
      NamedBarrierSync(1 + group, kPW * 32);
      if (forced == 0.f && sub == 0 && lane < p.num_heads) {
        const float* both = comb + (k & 1) * kSwMaxPageWarps * kSwMaxHeads + lane;
        float v = both[0];
#pragma unroll
        for (int w = 1; w < kPW; ++w) v = fmaxf(v, both[w * kSwMaxHeads]);
        score0[lane * head_stride] = v * p.scale;
      }
    }
    if (forced == 0.f) TraceScored(p.trace != nullptr, trace());
    step_on(cc);
  }
  TraceMathEnd(trace());
#endif  // INDEXER_GPU_WGMMA
}

// The launch shape: the knob's, else the default for Hi heads.
int SwShapeIndex(int32_t num_heads) {
  const int i = Knobs().block_stream_shape;
  if (i >= 0 && i < kSwShapeCount) return i;
  return num_heads <= 4 ? kSwDefaultShape : kSwDefaultShapeTwoTiles;
}

// A CTA's dynamic shared memory (tma: with 1024 bytes of alignment slack).
int64_t SwCtaSmem(const PageLayout& l, int shape, bool tma) {
  const SwShape& sh = kSwShapes[shape];
  return sh.warps / sh.page_warps * SwSmemOf(l.page_bytes(), l.page_entries, sh.stages, tma).bytes +
         (tma ? 1024 : 0);
}

// Whether `shape` fits one SM's shared memory: each CTA's share of the
// 228 KiB, less the 1 KiB it reserves.
bool SwFits(const PageLayout& l, int shape, bool tma) {
  return SwCtaSmem(l, shape, tma) <= 228 * 1024 / kSwShapes[shape].ctas_per_sm - 1024;
}

// The tensor-map variant: the pool has the map, the knob allows it, and the
// shape fits with the map's alignment (shape 3's three 128-entry stages do
// not: it keeps the page copies).
bool SwUseTma(const BlockScoreParams& p, int shape) {
  return p.use_tma && Knobs().block_tma && BlockScoresStreamTmaLayout(p.layout) && SwFits(p.layout, shape, true);
}

template <int kNT, bool kTiled, bool kTma, int kShape>
absl::Status LaunchStream(const BlockScoreParams& p, const BlockWorkMap& wm, Stream stream) {
  const int64_t smem = SwCtaSmem(p.layout, kShape, kTma);
  auto* kernel = &BlockScoresStreamKernel<kNT, kTiled, kTma, kShape>;
  GPU_RETURN_IF_ERROR(SetMaxDynamicSmem(kernel, static_cast<int>(smem)));
  GPU_LAUNCH(kernel, wm.ctas, kSwShapes[kShape].warps * 32, smem, stream, p, wm);
  return absl::OkStatus();
}

template <int kNT, int kShape>
absl::Status LaunchLayout(const BlockScoreParams& p, const BlockWorkMap& wm, Stream stream) {
  if (p.layout.tiled()) return LaunchStream<kNT, true, false, kShape>(p, wm, stream);
  if (SwUseTma(p, kShape)) return LaunchStream<kNT, false, true, kShape>(p, wm, stream);
  return LaunchStream<kNT, false, false, kShape>(p, wm, stream);
}

template <int kShape>
absl::Status LaunchShape(const BlockScoreParams& p, const BlockWorkMap& wm, Stream stream) {
  return p.num_heads <= 4 ? LaunchLayout<1, kShape>(p, wm, stream) : LaunchLayout<2, kShape>(p, wm, stream);
}

}  // namespace

bool BlockScoresStreamTmaLayout(const PageLayout& l) {
  // One page's values a box ({VB, E, 1}: box sides of at most 256, rows of
  // 64 bytes for the 64-byte swizzle), E x 64 a multiple of 1024 (E % 16),
  // the scales' bulk copy 16-byte aligned.
  return l.format == KvFormat::kMxfp4 && l.head_dim == kSwDim && !l.tiled() && l.page_entries % 16 == 0 &&
         l.page_entries <= kSwMaxEntries && l.page_bytes() % 16 == 0;
}

bool BlockScoresStreamSupported(const BlockScoreParams& p, int cc_major, int cc_minor) {
  (void)cc_minor;
  const PageLayout& l = p.layout;
  if (cc_major != 9) return false;
  if (l.format != KvFormat::kMxfp4 || l.head_dim != kSwDim) return false;
  if (p.num_heads < 1 || p.num_heads > kSwMaxHeads) return false;
  if (l.page_entries > kSwMaxEntries) return false;
  // Bulk copies: 16-byte sizes and page offsets; 4-byte value words.
  if (l.page_bytes() % 16 != 0) return false;
  // Whole 16-entry tiles inside the page.
  if (l.page_entries % 16 != 0) return false;
  if (l.tiled() && l.d_per_tile % 4 != 0) return false;
  // The page copies' variant (the tensor map's falls back to it).
  return SwFits(l, SwShapeIndex(p.num_heads), false);
}

int32_t BlockScoresStreamCtas(int32_t num_sms) {
  // Either default shape (the static_assert above): the count before Hi is known.
  return std::max(num_sms, 1) * kSwShapes[SwShapeIndex(1)].ctas_per_sm;
}

// LaunchShape<i> for a shape index known at run time: one entry per
// kSwShapes row, so that a new shape needs no dispatch of its own.
template <int... kI>
absl::Status LaunchShapeAt(int i, const BlockScoreParams& p, const BlockWorkMap& wm, Stream stream,
                           std::integer_sequence<int, kI...>) {
  using Launch = absl::Status (*)(const BlockScoreParams&, const BlockWorkMap&, Stream);
  constexpr Launch kLaunch[] = {&LaunchShape<kI>...};
  return kLaunch[i](p, wm, stream);
}

absl::Status LaunchBlockScoresStream(const BlockScoreParams& p_in, const BlockWorkMap& wm, Stream stream) {
  if (p_in.num_rows == 0 || p_in.width == 0 || wm.ctas == 0) return absl::OkStatus();
  BlockScoreParams p = p_in;
  p.evict_first = Knobs().ws_evict_first != 0;
  p.l2_prefetch = Knobs().block_prefetch;
  return LaunchShapeAt(SwShapeIndex(p.num_heads), p, wm, stream,
                       std::make_integer_sequence<int, kSwShapeCount>());
}

}  // namespace gpu
}  // namespace indexer

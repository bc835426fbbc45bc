// MiniMax-M3 block scores (SPEC §5 block path) on tensor cores, sm_89+:
//   score[h, r, b] = max over the visible entries e of page b of
//                    scale * (q[r, h] . k[e])
// with the init / local sentinels of the portable BlockScoresKernel
// (paths_kernels.cu), which keeps every other layout, head count and device.
//
// Arithmetic. K is MXFP4: each 32-element block j of an entry is e2m1
// values times 2^(ek_j - 127). Q is fp32; per (head, block j) it is scaled
// by 2^-E (E the exponent of the block's largest |q|, so |q'| < 2) and
// split into two fp16 parts q' = hi + lo (hi = fp16(q'), lo = fp16(q' - hi),
// |q' - hi - lo| <= 2^-22 |q'| for normal parts). e2m1 values are exact in
// fp16 and fp16 products exact in fp32, so one m16n8k16 fp16 mma chain per
// block gives P_j = sum over the block of (hi + lo) * k_e2m1 with fp32
// accumulation; then dot = sum_j P_j * 2^(ek_j - 127) * 2^E_j in fp32. The
// relative error stays near 2^-20 of sum |q k|, inside the block path's
// tolerance of 2^-16 (tests: GpuBlockTest; the cpu backend sums in fp32).
//
// Columns: n8 tile nt holds heads 4 nt .. 4 nt + 3, columns 0-3 their hi
// parts and 4-7 their lo parts; lanes t and t ^ 2 hold a head's two parts
// and add them with one shuffle. The reduction dimension is permuted
// identically in A and B so that quad lane t reads the bytes 4t..4t+3 of
// each block (elements 8t..8t+7): k-step 2j + s of block j covers elements
// 8t + 4s .. + 3 of lane t.
//
// Work: one warp per (row, page); a block of four warps takes pages
// x * 4 * P + warp + 4 i (i < P) of one row and stages that row's split Q
// once. Each warp walks its page in 16-entry tiles, the next tile's K in
// registers while the current one multiplies, and keeps the running maxima.
#include "kernels/gpu/gpu_compat.h"  // first: the runtime defines __device__ & co.

#include <algorithm>

#include "absl/strings/str_cat.h"
#include "kernels/format/fp8.h"
#include "kernels/format/mxfp4.h"
#include "kernels/gpu/hopper/mma_sm90.h"
#include "kernels/gpu/paged.h"
#include "kernels/gpu/params.h"

namespace indexer {
namespace gpu {
namespace {

constexpr int kBsWarps = 4;
constexpr int kBsThreads = kBsWarps * 32;
constexpr int kBsDim = 128;           // D
constexpr int kBsMaxHeads = 8;        // two n8 tiles
constexpr float kBsInitSentinel = 1e30f;   // as BlockScoresKernel
constexpr float kBsLocalSentinel = 1e29f;

// K of one 16-entry tile as a lane holds it: rows g and g + 8, block j's
// bytes 4t..4t+3 and the entry's four e8m0 scale bytes.
struct BsTile {
  uint32_t v[2][4];
  uint32_t sk[2];
};

#if INDEXER_GPU_MMA_FP8
// 2^(x - 127) of an e8m0 byte x < 255 (checked at input), as the float's
// bits: normal for x >= 1, the subnormal 2^-127 for 0.
__device__ __forceinline__ float E8m0ToFloat(uint32_t x) {
  return __uint_as_float(x != 0u ? x << 23 : 0x00400000u);
}
#endif

template <int kNT>
__global__ void __launch_bounds__(kBsThreads) BlockScoresMmaKernel(const BlockScoreParams p, int32_t per_warp) {
#if INDEXER_GPU_MMA_FP8
  constexpr int kCols = kNT * 8;
  static_assert(kBsDim == 4 * kMxBlock, "four MXFP4 blocks of 32 per entry");
  // Split Q, [k-step s][column][lane t] as uint2 (4 fp16: elements
  // 32 (s / 2) + 8 t + 4 (s % 2) + 0..3), and the columns' 2^E per block.
  __shared__ uint2 qb[8][kCols][4];
  __shared__ float fq[kCols][4];
  const PageLayout& l = p.layout;
  const int32_t heads = p.num_heads, lr = blockIdx.y, r = p.row_base + lr;
  const int32_t n = p.step.row_visible[r], per_page = l.page_entries;
  const int32_t causal = (n + per_page - 1) / per_page;
  const int tid = threadIdx.x;
  if (blockIdx.x == 0 && tid < heads) p.causal[tid * p.num_rows + lr] = causal;
  const int32_t first = blockIdx.x * kBsWarps * per_warp;
  if (first >= causal) return;

  // ---- stage Q: thread (h, j) splits head h's block j ----------------------
  if (tid < kNT * 4 * 4) {
    const int h = tid / 4, j = tid % 4;
    const int col = (h / 4) * 8 + h % 4;  // hi column; lo is col + 4
    uint16_t* qh = reinterpret_cast<uint16_t*>(&qb[0][0][0]);
    float x[32];
    float m = 0.f;
    if (h < heads) {
      const float* src = p.q + (static_cast<int64_t>(lr) * heads + h) * kBsDim + 32 * j;
#pragma unroll
      for (int i = 0; i < 32; ++i) {
        x[i] = src[i];
        m = fmaxf(m, fabsf(x[i]));
      }
    } else {
#pragma unroll
      for (int i = 0; i < 32; ++i) x[i] = 0.f;
    }
    // E: the exponent of the largest |q| (0 for an all-zero block), in
    // [-126, 127] so that 2^E and 2^-E are exact floats.
    const int32_t biased = static_cast<int32_t>((__float_as_uint(m) >> 23) & 0xffu);
    const int32_t e = m == 0.f ? 0 : max(biased - 127, -126);
    const float down = format_internal::ExactPow2(-e);
#pragma unroll
    for (int i = 0; i < 32; ++i) {
      const float y = x[i] * down;
      const uint16_t hi = F32ToF16Rn(y);
      const uint16_t lo = F32ToF16Rn(y - F16ToF32(hi));
      const int t = i / 8, s = 2 * j + (i % 8) / 4, k = i % 4;
      qh[((s * kCols + col) * 4 + t) * 4 + k] = hi;
      qh[((s * kCols + col + 4) * 4 + t) * 4 + k] = lo;
    }
    fq[col][j] = fq[col + 4][j] = format_internal::ExactPow2(e);
  }
  __syncthreads();

  const int warp = WarpId(), lane = LaneId(), g = lane / 4, t = lane % 4;
  const int32_t seq = p.step.row_seq[r];
  const int32_t* block_row = p.step.block_table + static_cast<int64_t>(seq) * p.step.max_pages;
  const int32_t local_begin = max(0, causal - p.local_blocks);
  // The row's Q fragments (B operands: column g of each tile, every
  // k-step) and the Q factors of this lane's columns 2t, 2t + 1 per block,
  // in registers for all of the block's pages.
  uint2 bq[kNT][8];
  float f0[kNT][4], f1[kNT][4];
#pragma unroll
  for (int nt = 0; nt < kNT; ++nt) {
#pragma unroll
    for (int s = 0; s < 8; ++s) bq[nt][s] = qb[s][nt * 8 + g][t];
#pragma unroll
    for (int j = 0; j < 4; ++j) {
      f0[nt][j] = fq[nt * 8 + 2 * t][j];
      f1[nt][j] = fq[nt * 8 + 2 * t + 1][j];
    }
  }

#pragma unroll 1
  for (int32_t i = 0; i < per_warp; ++i) {
    const int32_t b = first + warp + kBsWarps * i;
    if (b >= causal) break;
    float* score0 = p.scores + static_cast<int64_t>(lr) * p.width + b;  // head 0
    const int64_t head_stride = static_cast<int64_t>(p.num_rows) * p.width;
    const float forced = b < min(causal, p.init_blocks) ? kBsInitSentinel
                         : b >= local_begin            ? kBsLocalSentinel
                                                       : 0.f;
    if (forced != 0.f) {
      if (lane < heads) score0[lane * head_stride] = forced;
      continue;
    }
    const uint8_t* page = p.pool + l.PageOffset(block_row[b]);
    const bool linear = !l.tiled();
    const int32_t count = min(per_page, n - b * per_page);  // visible entries of the page
    auto load = [&](int32_t e0, BsTile& k) {
#pragma unroll
      for (int hf = 0; hf < 2; ++hf) {
        const int32_t e = e0 + g + 8 * hf;
        if (e < count && linear) {
          // Linear pages: an entry's 64 value bytes and its 4 scale bytes
          // are contiguous (one address computation, one scale word).
          const uint8_t* v = page + l.ValueOffset(e, 4 * t);
#pragma unroll
          for (int j = 0; j < 4; ++j) k.v[hf][j] = *reinterpret_cast<const uint32_t*>(v + 16 * j);
          k.sk[hf] = *reinterpret_cast<const uint32_t*>(page + l.ScaleOffset(e, 0));
        } else if (e < count) {
#pragma unroll
          for (int j = 0; j < 4; ++j) {
            k.v[hf][j] = *reinterpret_cast<const uint32_t*>(page + l.ValueOffset(e, 16 * j + 4 * t));
          }
          uint32_t s = 0;
#pragma unroll
          for (int j = 0; j < 4; ++j) s |= static_cast<uint32_t>(page[l.ScaleOffset(e, j)]) << (8 * j);
          k.sk[hf] = s;
        } else {
#pragma unroll
          for (int j = 0; j < 4; ++j) k.v[hf][j] = 0u;
          k.sk[hf] = 0x7f7f7f7fu;  // 2^0: finite products of zeros
        }
      }
    };
    float mx[kNT][2];
#pragma unroll
    for (int nt = 0; nt < kNT; ++nt) mx[nt][0] = mx[nt][1] = -INFINITY;
    BsTile cur, nxt;
    load(0, cur);
#pragma unroll 1
    for (int32_t e0 = 0; e0 < count; e0 += 16) {
      if (e0 + 16 < count) load(e0 + 16, nxt);
      float acc[kNT][4];
#pragma unroll
      for (int nt = 0; nt < kNT; ++nt) acc[nt][0] = acc[nt][1] = acc[nt][2] = acc[nt][3] = 0.f;
#pragma unroll
      for (int j = 0; j < 4; ++j) {
        const uint2 a0 = WidenE2m1ToHalf4(cur.v[0][j]), a0h = WidenE2m1ToHalf4(cur.v[0][j] >> 16);
        const uint2 a1 = WidenE2m1ToHalf4(cur.v[1][j]), a1h = WidenE2m1ToHalf4(cur.v[1][j] >> 16);
        const float sk0 = E8m0ToFloat((cur.sk[0] >> (8 * j)) & 0xffu);
        const float sk1 = E8m0ToFloat((cur.sk[1] >> (8 * j)) & 0xffu);
#pragma unroll
        for (int nt = 0; nt < kNT; ++nt) {
          const uint2 b0 = bq[nt][2 * j], b1 = bq[nt][2 * j + 1];
          float d[4] = {0.f, 0.f, 0.f, 0.f};
          MmaF16(d, a0.x, a1.x, a0.y, a1.y, b0.x, b0.y);
          MmaF16(d, a0h.x, a1h.x, a0h.y, a1h.y, b1.x, b1.y);
          acc[nt][0] = fmaf(d[0], sk0 * f0[nt][j], acc[nt][0]);
          acc[nt][1] = fmaf(d[1], sk0 * f1[nt][j], acc[nt][1]);
          acc[nt][2] = fmaf(d[2], sk1 * f0[nt][j], acc[nt][2]);
          acc[nt][3] = fmaf(d[3], sk1 * f1[nt][j], acc[nt][3]);
        }
      }
      // hi + lo (lanes t, t ^ 2), scaled; rows past the page's visible
      // entries do not count.
      const bool ok0 = e0 + g < count, ok1 = e0 + g + 8 < count;
#pragma unroll
      for (int nt = 0; nt < kNT; ++nt) {
#pragma unroll
        for (int c = 0; c < 4; ++c) acc[nt][c] += ShflXor(acc[nt][c], 2);
        mx[nt][0] = fmaxf(mx[nt][0], fmaxf(ok0 ? acc[nt][0] * p.scale : -INFINITY,
                                           ok1 ? acc[nt][2] * p.scale : -INFINITY));
        mx[nt][1] = fmaxf(mx[nt][1], fmaxf(ok0 ? acc[nt][1] * p.scale : -INFINITY,
                                           ok1 ? acc[nt][3] * p.scale : -INFINITY));
      }
      cur = nxt;
    }
    // Maxima over the 8 row lanes; lanes g = 0, t < 2 hold heads
    // 4 nt + 2t, + 1.
#pragma unroll
    for (int nt = 0; nt < kNT; ++nt) {
#pragma unroll
      for (int c = 0; c < 2; ++c) {
        float v = mx[nt][c];
        v = fmaxf(v, ShflXor(v, 4));
        v = fmaxf(v, ShflXor(v, 8));
        v = fmaxf(v, ShflXor(v, 16));
        const int h = 4 * nt + 2 * t + c;
        if (g == 0 && t < 2 && h < heads) score0[h * head_stride] = v;
      }
    }
  }
#endif  // INDEXER_GPU_MMA_FP8
}

}  // namespace

bool BlockScoresMmaSupported(const BlockScoreParams& p, int cc_major, int cc_minor) {
#if defined(INDEXER_GPU_HIP)
  (void)p, (void)cc_major, (void)cc_minor;
  return false;
#else
  const PageLayout& l = p.layout;
  if (cc_major * 10 + cc_minor < 89) return false;
  if (l.format != KvFormat::kMxfp4 || l.head_dim != kBsDim) return false;
  if (p.num_heads < 1 || p.num_heads > kBsMaxHeads) return false;
  // 4-byte value words, aligned, through the layout.
  if (l.page_bytes() % 4 != 0) return false;
  if (l.tiled() && l.d_per_tile % 4 != 0) return false;
  return true;
#endif
}

absl::Status LaunchBlockScoresMma(const BlockScoreParams& p, int32_t num_sms, Stream stream) {
  if (p.num_rows == 0 || p.width == 0) return absl::OkStatus();
  if (p.num_rows > 65535) {
    return absl::InvalidArgumentError(absl::StrCat(
        "block path rows per launch: expected at most 65535, got ", p.num_rows));
  }
  // Pages per warp: enough blocks for eight per SM, at least one page each;
  // more pages a warp when the rows x pages allow (Q staged once per block).
  const int64_t blocks1 = static_cast<int64_t>(p.num_rows) * ((p.width + kBsWarps - 1) / kBsWarps);
  const int32_t per_warp =
      static_cast<int32_t>(std::clamp<int64_t>(blocks1 / (8 * std::max(num_sms, 1)), 1, 8));
  const int32_t per_block = kBsWarps * per_warp;
  const dim3 grid(static_cast<unsigned>((p.width + per_block - 1) / per_block),
                  static_cast<unsigned>(p.num_rows));
  if (p.num_heads <= 4) {
    GPU_LAUNCH(BlockScoresMmaKernel<1>, grid, kBsThreads, 0, stream, p, per_warp);
  } else {
    GPU_LAUNCH(BlockScoresMmaKernel<2>, grid, kBsThreads, 0, stream, p, per_warp);
  }
  return absl::OkStatus();
}

}  // namespace gpu
}  // namespace indexer

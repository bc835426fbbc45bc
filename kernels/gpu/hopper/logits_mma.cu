// Tensor-core dense logits for sm_89+/sm_90 (SPEC §5), FP8 and MXFP4, read
// from the pages in place. One block per work unit (a row group of up to
// kMaxGroupRows rows of one sequence and an entry range); each warp walks
// 16-entry tiles with the next tile's K already in flight:
//   A = 16 entries x 128 (K from the page), B = 128 x 8 heads (Q in shared
//   memory), C = fp32, epilogue ReLU * w summed over heads, times kscale.
// The reduction dimension is permuted identically in A and B so that every
// lane loads its K bytes as 16-byte (FP8) or 4-byte (MXFP4) vectors.
// MXFP4: each k32 step is one 32-element block; e2m1 is widened exactly to
// e4m3, the block's partial product is exact in fp32, then scaled by
// 2^(eq + ek) and accumulated.
#include "kernels/gpu/gpu_compat.h"  // first: the runtime defines __device__ & co.

#include "kernels/format/fp8.h"
#include "kernels/format/mxfp4.h"
#include "kernels/gpu/dispatch.h"
#include "kernels/gpu/hopper/mma_sm90.h"
#include "kernels/gpu/paged.h"
#include "kernels/gpu/params.h"
#include "kernels/gpu/per_device.h"

namespace indexer {
namespace gpu {
namespace {

constexpr int kMmaWarps = 4;
constexpr int kMmaThreads = kMmaWarps * 32;
constexpr int kMmaDim = 128;  // D of the tensor-core path
constexpr int kTileM = 16;    // entries per mma tile

// Shared bytes per head row of Q (128 e4m3 codes + padding so the fragment
// loads of one phase hit distinct banks).
template <KvFormat kFmt>
constexpr int kQStride = kFmt == KvFormat::kFp8 ? 144 : 160;

template <KvFormat kFmt, int kHeads>
constexpr int64_t MmaSmemBytes(int rows) {
  return static_cast<int64_t>(rows) * kHeads * (kQStride<kFmt> + 4 + 4 * (kMmaDim / kMxBlock));
}

// K of one 16-entry tile as this lane holds it (rows g and g + 8).
template <KvFormat kFmt>
struct KTile;
template <>
struct KTile<KvFormat::kFp8> {
  uint32_t v[2][8];  // bytes t*32 .. t*32 + 31 of each row
  float kscale[2];
};
template <>
struct KTile<KvFormat::kMxfp4> {
  uint32_t v[2][4];  // word j: packed bytes j*16 + t*4 .. +3 (block j)
  uint32_t sk[2];    // the entry's 4 e8m0 scale bytes
};

template <KvFormat kFmt, int kHeads>
__global__ void __launch_bounds__(kMmaThreads)
    DenseLogitsMmaKernel(const LogitsParams p) {
#if INDEXER_GPU_MMA_FP8
  static_assert(kHeads % 8 == 0, "heads are whole mma N tiles of 8");
  static_assert(kMmaDim == 4 * kMxBlock, "four k32 steps, one MXFP4 block each");
  static_assert(kMmaThreads == kMmaWarps * kWarpSize, "the mma path is 32-lane");
  constexpr int kNT = kHeads / 8;
  constexpr int kQS = kQStride<kFmt>;
  constexpr bool kFp8 = kFmt == KvFormat::kFp8;
  extern __shared__ __align__(16) uint8_t smem[];
  const int rows_cap = p.max_group_rows;
  uint8_t* q_s = smem;                                             // [R, H, kQS]
  float* w_s = reinterpret_cast<float*>(smem + rows_cap * kHeads * kQS);  // [R, H]
  float* sq_s = w_s + rows_cap * kHeads;                           // [R, H, 4]

  const LogitsUnit u = p.step.units[p.unit_begin + blockIdx.x];
  const LogitsGroup g = p.step.groups[u.group];
  const PageLayout& l = p.layout;
  const int32_t* block_row = p.step.block_table + static_cast<int64_t>(g.seq) * p.step.max_pages;
  const int64_t q0 = static_cast<int64_t>(g.row_begin - p.row_base) * kHeads;

  // ---- stage the group's Q (widened to e4m3), weights, Q block scales ----
  if (kFp8) {
    for (int i = threadIdx.x; i < g.num_rows * kHeads * 8; i += kMmaThreads) {
      const int rh = i / 8, c = i % 8;
      *reinterpret_cast<uint4*>(q_s + rh * kQS + c * 16) =
          *reinterpret_cast<const uint4*>(p.q_values + (q0 + rh) * kMmaDim + c * 16);
    }
  } else {
    for (int i = threadIdx.x; i < g.num_rows * kHeads * 16; i += kMmaThreads) {
      const int rh = i / 16, c = i % 16;
      const uint32_t w = *reinterpret_cast<const uint32_t*>(p.q_values + (q0 + rh) * (kMmaDim / 2) + c * 4);
      *reinterpret_cast<uint2*>(q_s + rh * kQS + c * 8) = WidenE2m1(w);
    }
    for (int i = threadIdx.x; i < g.num_rows * kHeads * 4; i += kMmaThreads) {
      sq_s[i] = format_internal::ExactPow2(static_cast<int32_t>(p.q_scales[q0 * 4 + i]) - 127);
    }
  }
  for (int i = threadIdx.x; i < g.num_rows * kHeads; i += kMmaThreads) w_s[i] = p.weights[q0 + i];
  __syncthreads();

  const int lane = LaneId(), gq = lane / 4, t = lane % 4;
  int32_t n_r[kMaxGroupRows];
#pragma unroll
  for (int r = 0; r < kMaxGroupRows; ++r) n_r[r] = r < g.num_rows ? p.step.row_visible[g.row_begin + r] : 0;

  // ---- K tile loads -------------------------------------------------------
  auto load = [&](int32_t m0, KTile<kFmt>& k) {
#pragma unroll
    for (int h = 0; h < 2; ++h) {
      const int32_t pos = m0 + gq + 8 * h;
      if (pos < u.e_end) {
        const EntryRef ref = LocateEntry(l, p.pool, block_row, pos);
        if constexpr (kFp8) {
          const uint4 x = *reinterpret_cast<const uint4*>(ref.page + l.ValueOffset(ref.e, t * 32));
          const uint4 y = *reinterpret_cast<const uint4*>(ref.page + l.ValueOffset(ref.e, t * 32 + 16));
          k.v[h][0] = x.x; k.v[h][1] = x.y; k.v[h][2] = x.z; k.v[h][3] = x.w;
          k.v[h][4] = y.x; k.v[h][5] = y.y; k.v[h][6] = y.z; k.v[h][7] = y.w;
          k.kscale[h] = Fp8EntryScale(l, ref);
        } else {
#pragma unroll
          for (int j = 0; j < 4; ++j) {
            k.v[h][j] = *reinterpret_cast<const uint32_t*>(ref.page + l.ValueOffset(ref.e, j * 16 + t * 4));
          }
          uint32_t s = 0;
#pragma unroll
          for (int j = 0; j < 4; ++j) s |= static_cast<uint32_t>(ref.page[l.ScaleOffset(ref.e, j)]) << (8 * j);
          k.sk[h] = s;
        }
      } else {
        if constexpr (kFp8) {
#pragma unroll
          for (int j = 0; j < 8; ++j) k.v[h][j] = 0;
          k.kscale[h] = 0.f;
        } else {
#pragma unroll
          for (int j = 0; j < 4; ++j) k.v[h][j] = 0;
          k.sk[h] = 0;
        }
      }
    }
  };

  // ---- one tile: mma per row of the group, ReLU * w epilogue --------------
  auto compute = [&](int32_t m0, const KTile<kFmt>& k) {
    uint32_t a[2][8];  // FP8: the raw words; MXFP4: widened block j in 2j, 2j+1
    float sk[2][4];
#pragma unroll
    for (int h = 0; h < 2; ++h) {
      if constexpr (kFp8) {
#pragma unroll
        for (int j = 0; j < 8; ++j) a[h][j] = k.v[h][j];
      } else {
#pragma unroll
        for (int j = 0; j < 4; ++j) {
          const uint2 w = WidenE2m1(k.v[h][j]);
          a[h][2 * j] = w.x;
          a[h][2 * j + 1] = w.y;
          sk[h][j] = format_internal::ExactPow2(static_cast<int32_t>((k.sk[h] >> (8 * j)) & 0xff) - 127);
        }
      }
    }
#pragma unroll
    for (int r = 0; r < kMaxGroupRows; ++r) {
      if (r >= g.num_rows) break;
      const uint8_t* qr = q_s + r * kHeads * kQS;
      float s0 = 0.f, s1 = 0.f;
#pragma unroll
      for (int nt = 0; nt < kNT; ++nt) {
        const uint8_t* qh = qr + (nt * 8 + gq) * kQS;
        float c[4] = {0.f, 0.f, 0.f, 0.f};
        if constexpr (kFp8) {
          const uint4 x = *reinterpret_cast<const uint4*>(qh + t * 32);
          const uint4 y = *reinterpret_cast<const uint4*>(qh + t * 32 + 16);
          const uint32_t b[8] = {x.x, x.y, x.z, x.w, y.x, y.y, y.z, y.w};
#pragma unroll
          for (int j = 0; j < 4; ++j) {
            MmaE4m3(c, a[0][2 * j], a[1][2 * j], a[0][2 * j + 1], a[1][2 * j + 1], b[2 * j], b[2 * j + 1]);
          }
        } else {
          const float* sq = sq_s + (r * kHeads + nt * 8 + 2 * t) * 4;
#pragma unroll
          for (int j = 0; j < 4; ++j) {
            const uint2 b = *reinterpret_cast<const uint2*>(qh + j * 32 + t * 8);
            float d[4] = {0.f, 0.f, 0.f, 0.f};
            MmaE4m3(d, a[0][2 * j], a[1][2 * j], a[0][2 * j + 1], a[1][2 * j + 1], b.x, b.y);
            const float sq0 = sq[j], sq1 = sq[4 + j];
            c[0] = fmaf(d[0], sk[0][j] * sq0, c[0]);
            c[1] = fmaf(d[1], sk[0][j] * sq1, c[1]);
            c[2] = fmaf(d[2], sk[1][j] * sq0, c[2]);
            c[3] = fmaf(d[3], sk[1][j] * sq1, c[3]);
          }
        }
        const float2 w = *reinterpret_cast<const float2*>(w_s + r * kHeads + nt * 8 + 2 * t);
        s0 = fmaf(fmaxf(c[0], 0.f), w.x, fmaf(fmaxf(c[1], 0.f), w.y, s0));
        s1 = fmaf(fmaxf(c[2], 0.f), w.x, fmaf(fmaxf(c[3], 0.f), w.y, s1));
      }
      s0 += ShflXor(s0, 1);
      s0 += ShflXor(s0, 2);
      s1 += ShflXor(s1, 1);
      s1 += ShflXor(s1, 2);
      if (t == 0) {
        float* out = p.logits + static_cast<int64_t>(g.row_begin + r - p.row_base) * p.stride;
        const int32_t pos0 = m0 + gq, pos1 = pos0 + 8;
        if constexpr (kFp8) {
          s0 *= k.kscale[0];
          s1 *= k.kscale[1];
        }
        if (pos0 < n_r[r]) out[pos0] = s0;
        if (pos1 < n_r[r]) out[pos1] = s1;
      }
    }
  };

  // ---- the unit's tiles, one ahead in flight ------------------------------
  constexpr int kStep = kMmaWarps * kTileM;
  int32_t m0 = u.e_begin + WarpId() * kTileM;
  if (m0 >= u.e_end) return;
  KTile<kFmt> cur, nxt;
  load(m0, cur);
#pragma unroll 1
  for (; m0 < u.e_end; m0 += kStep) {
    if (m0 + kStep < u.e_end) load(m0 + kStep, nxt);
    compute(m0, cur);
    cur = nxt;
  }
#endif  // INDEXER_GPU_MMA_FP8
}

}  // namespace

bool MmaLogitsSupported(const LogitsParams& p, int cc_major, int cc_minor) {
  const PageLayout& l = p.layout;
  if (cc_major * 10 + cc_minor < 89) return false;
  if (l.head_dim != kMmaDim || !MmaHeadsSupported(p.num_heads)) return false;
  if (p.max_group_rows > kMaxGroupRows) return false;
  // 16-byte (FP8) / 4-byte (MXFP4) K vectors must stay contiguous and aligned.
  if (l.page_bytes() % 16 != 0) return false;
  if (l.tiled() && l.d_per_tile % (l.format == KvFormat::kFp8 ? 16 : 4) != 0) return false;
  return true;
}

absl::Status LaunchDenseLogitsMma(const LogitsParams& p, Stream stream) {
  const int32_t units = p.unit_end - p.unit_begin;
  if (units == 0) return absl::OkStatus();
  return DispatchFormat(p.layout.format, [&](auto fmt) {
    return DispatchMmaHeads(p.num_heads, [&](auto heads) -> absl::Status {
      constexpr KvFormat kFmt = decltype(fmt)::value;
      constexpr int kHeads = decltype(heads)::value;
      auto* kernel = &DenseLogitsMmaKernel<kFmt, kHeads>;
      const int64_t smem = MmaSmemBytes<kFmt, kHeads>(p.max_group_rows);
      // Once per device (per_device.h), for the largest group (keeps host
      // calls off the timed path).
      static PerDevice<absl::Status> setup;
      const absl::Status limit = setup.Get([&]() -> absl::Status {
        GPU_RETURN_IF_ERROR(SetMaxDynamicSmem(kernel, static_cast<int>(MmaSmemBytes<kFmt, kHeads>(kMaxGroupRows))));
        return absl::OkStatus();
      });
      if (!limit.ok()) return limit;
      GPU_LAUNCH(kernel, units, kMmaThreads, smem, stream, p);
      return absl::OkStatus();
    });
  });
}

}  // namespace gpu
}  // namespace indexer

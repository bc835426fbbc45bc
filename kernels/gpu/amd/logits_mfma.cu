// Dense logits (SPEC §5) on AMD matrix cores, written against 64-lane waves:
//   FP8:   logit[r, e] = kscale[e] * sum_h w[r, h] * ReLU(q[r, h] . k[e])
//          v_mfma_f32_32x32x16_fp8_fp8 (gfx942: e4m3fnuz operands; gfx950:
//          OCP e4m3 operands)
//   MXFP4: the same with the block-scaled dot of SPEC §3 and no kscale,
//          v_mfma_scale_f32_32x32x64_f8f6f4 with FP4 operands and E8M0
//          scales (gfx950 only; gfx942 has no FP4 matrix instruction).
// On CUDA every Mfma*/Wave* call runs the instruction model of the compat
// seam (kernels/gpu/amd/mfma_model.h), so these kernels, with their tiling,
// page walk, lane arithmetic and wave reductions, run on the H200 and are
// checked against the cpu backend (gpu_backend_test, the MFMA shapes).
//
// Work: the portable kernel's units (a row group of one sequence and an
// entry range). A block is kMfmaWaves waves; wave w takes the unit's 32-entry
// tiles w, w + kMfmaWaves, ... One tile is the B operand (K^T: D x 32
// entries, each lane one entry's bytes per the ISA table), loaded once and
// used for every row of the group and both 32-head halves of Q (the A
// operand, from shared memory). The accumulator gives each lane 16 heads of
// one entry (lanes l and l ^ 32 hold the same entry); each lane weighs its
// heads, one cross-half exchange sums the entry's 64 heads, lanes 0..31 write.
//
// gfx942 reads an OCP e4m3 cache's bytes as e4m3fnuz: the same bits are
// half the OCP value (bias 8, not 7; subnormals likewise) except 0x80, OCP
// -0 but the fnuz NaN. So 0x80 bytes of Q and K become 0x00 and the dot is
// scaled by 4 (exact). OCP NaN codes (0x7f, 0xff) never reach the kernel
// (quantized K is checked on write; Q codes are the client's). An e4m3fnuz
// cache is read as it is on gfx942; gfx950 (OCP operands) does not take it
// (0x7f is 240 there and NaN to the matrix core): portable.
#include "kernels/gpu/gpu_compat.h"  // first: the runtime defines __device__ & co.

#include <cstdlib>
#include <cstring>

#include "kernels/gpu/amd/mfma_lanes.h"
#include "kernels/gpu/paged.h"
#include "kernels/gpu/knobs.h"
#include "kernels/gpu/params.h"
#include "kernels/gpu/per_device.h"

namespace indexer {
namespace gpu {
namespace {

constexpr int kMfmaWaves = 4;
constexpr int kMfmaThreads = kMfmaWaves * kWaveSize;
constexpr int kMfmaDim = 128;     // head_dim the kernels take
constexpr int kHeadTile = 32;     // A rows (heads) of one MFMA
constexpr int kEntryTile = 32;    // B columns (entries) of one MFMA
constexpr int kMfmaMaxHeads = 64;
static_assert(kMfmaWaves < 16, "named barriers 1..15 (the CUDA model)");

enum class MfmaArch : int { kGfx942 = 942, kGfx950 = 950 };

// Whether an FP8 cache holds e4m3fnuz codes (the cache's variant).
inline bool MfmaCacheFnuz(const PageLayout& l) { return l.fp8 == Fp8Variant::kE4m3fnuz; }

using L8 = mfma::Fp8x32x32x16;
using L4 = mfma::Fp4x32x32x64;
static_assert(L8::kM == kHeadTile && L8::kN == kEntryTile, "FP8 tile");
static_assert(L4::kM == kHeadTile && L4::kN == kEntryTile, "FP4 tile");

// Bytes of Q one head holds in shared memory: FP8 values, or packed FP4
// values then 4 E8M0 scales.
template <KvFormat kFmt>
__host__ __device__ constexpr int QHeadBytes() {
  return kFmt == KvFormat::kFp8 ? kMfmaDim : kMfmaDim / 2 + kMfmaDim / 32;
}
// Shared memory: WaveScratch [kMfmaWaves] | w [rows, hp] fp32 | q [rows, hp, QHeadBytes].
template <KvFormat kFmt>
__host__ __device__ inline int64_t MfmaSmemBytes(int32_t heads, int32_t rows) {
  const int64_t hp = (heads + kHeadTile - 1) / kHeadTile * kHeadTile;
  const int64_t q = (rows * hp * QHeadBytes<kFmt>() + 15) / 16 * 16;
  return static_cast<int64_t>(sizeof(WaveScratch)) * kMfmaWaves + rows * hp * 4 + q;
}

// gfx942 operands: OCP 0x80 (-0) bytes to 0x00 (fnuz NaN otherwise). Exact
// zero-byte test: a byte of t = x ^ 0x80.. is zero iff bit 7 of
// ~(((t & 0x7f..) + 0x7f..) | t | 0x7f..) is set.
__device__ __forceinline__ uint64_t ClearNegZeros(uint64_t x) {
  constexpr uint64_t k7f = 0x7f7f7f7f7f7f7f7full;
  const uint64_t t = x ^ 0x8080808080808080ull;
  const uint64_t zero = ~(((t & k7f) + k7f) | t | k7f);  // 0x80 in bytes that were 0x80
  return x & ~((zero >> 7) * 0xffull);
}

// `n` value bytes of entry `ref` from byte `d`, little-endian into words:
// one load per 8 bytes where the layout keeps them contiguous and aligned.
__device__ __forceinline__ void LoadValueBytes(const PageLayout& l, EntryRef ref, int32_t d, int n, uint8_t* out) {
  const int64_t off = l.ValueOffset(ref.e, d);
  const uint8_t* src = ref.page + off;
  if (l.ValueOffset(ref.e, d + n - 1) == off + n - 1 && (reinterpret_cast<uintptr_t>(src) & 7) == 0) {
    for (int i = 0; i < n; i += 8) *reinterpret_cast<uint64_t*>(out + i) = *reinterpret_cast<const uint64_t*>(src + i);
  } else {
    for (int i = 0; i < n; ++i) out[i] = ref.page[l.ValueOffset(ref.e, d + i)];
  }
}

template <KvFormat kFmt, MfmaArch kArch, bool kCacheFnuz>
__global__ void __launch_bounds__(kMfmaThreads) DenseLogitsMfmaKernel(const LogitsParams p) {
  constexpr bool kFp8 = kFmt == KvFormat::kFp8;
  // OCP codes read by gfx942's fnuz matrix cores: -0 cleared, dot x 4.
  constexpr bool kFnToFnuz = kFp8 && kArch == MfmaArch::kGfx942 && !kCacheFnuz;
  constexpr mfma::Fp8Kind kKind = kArch == MfmaArch::kGfx942 ? mfma::Fp8Kind::kFnuz : mfma::Fp8Kind::kFn;
  constexpr int kQb = QHeadBytes<kFmt>();
  constexpr int kSteps = kMfmaDim / (kFp8 ? L8::kK : L4::kK);  // MFMAs along D
  extern __shared__ __align__(16) uint8_t smem[];
  const PageLayout& l = p.layout;
  const int32_t heads = p.num_heads;
  const int32_t hp = (heads + kHeadTile - 1) / kHeadTile * kHeadTile;
  const LogitsUnit u = p.step.units[p.unit_begin + blockIdx.x];
  const int32_t nr = u.num_rows;
  WaveScratch* scratch = reinterpret_cast<WaveScratch*>(smem);
  float* w_s = reinterpret_cast<float*>(smem + sizeof(WaveScratch) * kMfmaWaves);  // [nr, hp]
  uint8_t* q_s = reinterpret_cast<uint8_t*>(w_s + nr * hp);                     // [nr, hp, kQb]
  const int32_t vb = l.value_bytes();

  // ---- stage the group's Q (zero heads past H) and weights ---------------
  for (int32_t i = threadIdx.x; i < nr * hp * kQb; i += blockDim.x) {
    const int32_t r = i / (hp * kQb), h = i / kQb % hp, b = i % kQb;
    const int64_t qh = static_cast<int64_t>(u.row_begin + r - p.row_base) * heads + h;
    uint8_t v = kFp8 ? 0 : (b < kMfmaDim / 2 ? 0 : 127);  // padded heads: zero values, unit scales
    if (h < heads) v = b < vb ? p.q_values[qh * vb + b] : p.q_scales[qh * (kMfmaDim / 32) + (b - vb)];
    if (kFnToFnuz && v == 0x80) v = 0;
    q_s[i] = v;
  }
  for (int32_t i = threadIdx.x; i < nr * hp; i += blockDim.x) {
    const int32_t r = i / hp, h = i % hp;
    w_s[i] = h < heads ? p.weights[static_cast<int64_t>(u.row_begin + r - p.row_base) * heads + h] : 0.f;
  }
  __syncthreads();

  const int wave = WaveIndex(), lane = WaveLane();
  WaveScratch* ws = scratch + wave;
  const int32_t* block_row = p.step.block_table + static_cast<int64_t>(u.seq) * p.step.max_pages;
  // The lane's operand coordinates (ISA tables, mfma_lanes.h): its A row is
  // head a0.row of a head tile and its bytes / nibbles run along D from
  // a0.col; its B column is entry b0.col of the tile, along D from b0.row.
  const mfma::Elem a0 = kFp8 ? L8::A(lane, 0) : L4::A(lane, 0);
  const mfma::Elem b0 = kFp8 ? L8::B(lane, 0) : L4::B(lane, 0);
  const mfma::Elem s0 = L4::Scale(lane);  // MXFP4: (head / entry, K block) of the lane's scale

  for (int32_t e0 = u.e_begin + wave * kEntryTile; e0 < u.e_end; e0 += kMfmaWaves * kEntryTile) {
    const int32_t e = e0 + b0.col;
    const bool valid = e < u.e_end;
    // ---- B: this tile's K, D along the MFMA steps --------------------------
    uint64_t b8[kFp8 ? kSteps : 1] = {};
    uint32_t b4[kFp8 ? 1 : kSteps][4] = {};
    uint32_t bs[kFp8 ? 1 : kSteps] = {};
    float kscale = 0.f;
    if (valid) {
      const EntryRef ref = LocateEntry(l, p.pool, block_row, e);
      if constexpr (kFp8) {
        kscale = Fp8EntryScale(l, ref);
#pragma unroll
        for (int s = 0; s < kSteps; ++s) {
          LoadValueBytes(l, ref, s * L8::kK + b0.row, 8, reinterpret_cast<uint8_t*>(&b8[s]));
          if (kFnToFnuz) b8[s] = ClearNegZeros(b8[s]);
        }
      } else {
#pragma unroll
        for (int s = 0; s < kSteps; ++s) {
          LoadValueBytes(l, ref, (s * L4::kK + b0.row) / 2, 16, reinterpret_cast<uint8_t*>(b4[s]));
          bs[s] = ref.page[l.ScaleOffset(ref.e, s * (L4::kK / 32) + s0.col)];
        }
      }
    }
    // ---- every row of the group against the tile ----------------------------
    for (int32_t r = 0; r < nr; ++r) {
      float part = 0.f;
      for (int32_t h0 = 0; h0 < hp; h0 += kHeadTile) {
        MfmaAcc16 acc;
#pragma unroll
        for (int v = 0; v < 16; ++v) acc.v[v] = 0.f;
        const uint8_t* qh = q_s + (static_cast<int64_t>(r) * hp + h0 + a0.row) * kQb;
#pragma unroll
        for (int s = 0; s < kSteps; ++s) {
          if constexpr (kFp8) {
            const uint64_t a = *reinterpret_cast<const uint64_t*>(qh + s * L8::kK + a0.col);
            MfmaFp8x32x32x16<kKind>(a, b8[s], acc, ws);
          } else {
            // 4-byte aligned: heads are kQb = 68 bytes apart from a 16-byte base.
            const uint32_t* qa = reinterpret_cast<const uint32_t*>(qh + (s * L4::kK + a0.col) / 2);
            const uint32_t a[4] = {qa[0], qa[1], qa[2], qa[3]};
            const uint32_t sa = qh[kMfmaDim / 2 + s * (L4::kK / 32) + s0.col];
            MfmaScaleFp4x32x32x64(a, b4[s], sa, bs[s], acc, ws);
          }
        }
        const float* w = w_s + r * hp + h0;
#pragma unroll
        for (int v = 0; v < 16; ++v) part = fmaf(w[L8::D(lane, v).row], fmaxf(acc.v[v], 0.f), part);
      }
      // Lanes holding the same entry (the D table: column lane % 32) sum.
      for (int off = kEntryTile; off < kWaveSize; off *= 2) part += WaveShflXor(part, off, ws);
      const int32_t row = u.row_begin + r;
      if (lane < kEntryTile && valid && e < p.step.row_visible[row]) {
        float logit = part;
        if constexpr (kFp8) logit *= kFnToFnuz ? 4.f * kscale : kscale;
        p.logits[static_cast<int64_t>(row - p.row_base) * p.stride + e] = logit;
      }
    }
  }
}

template <KvFormat kFmt, MfmaArch kArch, bool kCacheFnuz = false>
absl::Status Launch(const LogitsParams& p, Stream stream) {
  auto* kernel = &DenseLogitsMfmaKernel<kFmt, kArch, kCacheFnuz>;
  // Once per device (per_device.h), for the largest group (keeps host calls off the timed path).
  static PerDevice<absl::Status> setup;
  const absl::Status limit = setup.Get([&]() -> absl::Status {
    GPU_RETURN_IF_ERROR(SetMaxDynamicSmem(kernel, static_cast<int>(MfmaSmemBytes<kFmt>(kMfmaMaxHeads, kMaxGroupRows))));
    return absl::OkStatus();
  });
  if (!limit.ok()) return limit;
  const int64_t smem = MfmaSmemBytes<kFmt>(p.num_heads, p.max_group_rows);
  GPU_LAUNCH(kernel, p.unit_end - p.unit_begin, kMfmaThreads, smem, stream, p);
  return absl::OkStatus();
}

// The INDEXER_GPU_MFMA_MODEL knob (knobs.h): on CUDA the default logits
// choice runs the MFMA kernels through the instruction model.
int EnvModelArch() { return Knobs().mfma_model_arch; }

}  // namespace

bool MfmaLogitsSupported(const LogitsParams& p, int arch) {
  const PageLayout& l = p.layout;
  if (arch != 942 && arch != 950) return false;
  if (l.head_dim != kMfmaDim || p.num_heads < 1 || p.num_heads > kMfmaMaxHeads) return false;
  if (p.max_group_rows < 1 || p.max_group_rows > kMaxGroupRows) return false;
  if (l.format == KvFormat::kFp8) return arch == 942 || !MfmaCacheFnuz(l);
  return arch == 950;  // FP4 matrix cores: gfx950
}

int MfmaLogitsArch(const LogitsParams& p, int cc_major, int cc_minor, int max_path) {
  int arch = 0;
  if (kRuntimeIsHip) {
    // hipDeviceProp major.minor of gfx942 is 9.4, of gfx950 9.5.
    if (cc_major == 9 && (cc_minor == 4 || cc_minor == 5) && max_path >= 1) arch = cc_minor == 4 ? 942 : 950;
  } else if (max_path == kPathMfmaGfx942 || max_path == kPathMfmaGfx950) {
    arch = max_path == kPathMfmaGfx942 ? 942 : 950;
  } else if (max_path == 2) {
    arch = EnvModelArch();
  }
  return arch != 0 && MfmaLogitsSupported(p, arch) ? arch : 0;
}

const char* MfmaPathName(int arch) {
  if (kRuntimeIsHip) return arch == 942 ? "mfma_gfx942" : "mfma_gfx950";
  return arch == 942 ? "mfma_model_gfx942" : "mfma_model_gfx950";
}

absl::Status LaunchDenseLogitsMfma(const LogitsParams& p, int arch, Stream stream) {
  if (!MfmaLogitsSupported(p, arch)) {
    return absl::InvalidArgumentError(absl::StrCat(
        "mfma logits: expected D = 128, 1..64 heads, groups of 1..", kMaxGroupRows,
        " rows and FP8 (gfx942; gfx950 for OCP e4m3 caches) or MXFP4 (gfx950), got D ", p.layout.head_dim, ", H ", p.num_heads,
        ", group rows ", p.max_group_rows, ", arch gfx", arch));
  }
  if (p.unit_end == p.unit_begin) return absl::OkStatus();
  if (p.layout.format == KvFormat::kMxfp4) return Launch<KvFormat::kMxfp4, MfmaArch::kGfx950>(p, stream);
  if (arch == 942) {
    return MfmaCacheFnuz(p.layout) ? Launch<KvFormat::kFp8, MfmaArch::kGfx942, true>(p, stream)
                                   : Launch<KvFormat::kFp8, MfmaArch::kGfx942>(p, stream);
  }
  return Launch<KvFormat::kFp8, MfmaArch::kGfx950>(p, stream);
}

}  // namespace gpu
}  // namespace indexer

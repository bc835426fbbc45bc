// Portable dense logits (SPEC §5), FP8 and MXFP4, any layout, H and D: the
// fallback on every device and the HIP path until MFMA kernels land.
//   FP8:   logit[r, e] = kscale[e] * sum_h w[r, h] * ReLU(q[r, h] . k[e])
//   MXFP4: the same with sum_b 2^(eq + ek) * (q_b . k_b) and no kscale.
// One block per work unit (a row group and an entry range); one thread per
// entry; the group's Q, dequantized to fp32, sits in shared memory.
#include "kernels/gpu/gpu_compat.h"  // first: the runtime defines __device__ & co.

#include "kernels/format/fp8.h"
#include "kernels/format/mxfp4.h"
#include "kernels/gpu/paged.h"
#include "kernels/gpu/params.h"

namespace indexer {
namespace gpu {
namespace {

constexpr int kPortableThreads = 128;
// Heads per register tile; shared Q is padded to a whole tile with zeros.
constexpr int kHeadTile = 8;
static_assert(kPortableThreads % kWarpSize == 0, "whole warps per block");
static_assert(kMxBlock == 32, "a D block is one MXFP4 scale");

// Shared memory: q [Hp, D] fp32 | w [Hp] | qscale [Hp, D/32] (MXFP4).
__host__ __device__ inline int64_t PortableSmemBytes(int32_t heads, int32_t dim) {
  const int64_t hp = (heads + kHeadTile - 1) / kHeadTile * kHeadTile;
  return hp * dim * 4 + hp * 4 + hp * (dim / kMxBlock) * 4;
}

// kVar: the FP8 variant of the cache (and of Q, converted on input); a
// template constant, so the e4m3fn instantiation is unchanged.
template <Fp8Variant kVar>
__device__ __forceinline__ float DecodeCacheFp8(uint8_t c) {
  if constexpr (kVar == Fp8Variant::kE4m3fnuz) {
    return DecodeE4m3fnuz(c);
  } else {
    return DecodeE4m3(c);
  }
}

template <KvFormat kFmt, Fp8Variant kVar = Fp8Variant::kE4m3fn>
__global__ void __launch_bounds__(kPortableThreads)
    DenseLogitsPortableKernel(const LogitsParams p) {
  extern __shared__ float smem[];
  const PageLayout& l = p.layout;
  const int32_t dim = l.head_dim, nb = dim / kMxBlock;
  const int32_t hp = (p.num_heads + kHeadTile - 1) / kHeadTile * kHeadTile;
  float* q_s = smem;                  // [hp, dim]
  float* w_s = q_s + hp * dim;        // [hp]
  float* qs_s = w_s + hp;             // [hp, nb]

  const LogitsUnit u = p.step.units[p.unit_begin + blockIdx.x];
  const LogitsGroup g = p.step.groups[u.group];
  const int32_t* block_row = p.step.block_table + static_cast<int64_t>(g.seq) * p.step.max_pages;
  const int32_t vb = l.value_bytes();

  for (int32_t r = g.row_begin; r < g.row_begin + g.num_rows; ++r) {
    const int32_t lr = r - p.row_base;  // row inside the sub-chunk
    const int32_t n_r = p.step.row_visible[r];
    // ---- stage this row's Q, weights (and block scales) -----------------
    __syncthreads();
    for (int32_t i = threadIdx.x; i < hp * dim; i += blockDim.x) {
      const int32_t h = i / dim, d = i % dim;
      float v = 0.f;
      if (h < p.num_heads) {
        const uint8_t* qv = p.q_values + (static_cast<int64_t>(lr) * p.num_heads + h) * vb;
        v = kFmt == KvFormat::kFp8 ? DecodeCacheFp8<kVar>(qv[d])
                                   : DecodeE2m1(static_cast<uint8_t>(qv[d / 2] >> ((d & 1) * 4)) & 0xf);
      }
      q_s[i] = v;
    }
    for (int32_t h = threadIdx.x; h < hp; h += blockDim.x) {
      w_s[h] = h < p.num_heads ? p.weights[static_cast<int64_t>(lr) * p.num_heads + h] : 0.f;
    }
    if (kFmt == KvFormat::kMxfp4) {
      for (int32_t i = threadIdx.x; i < hp * nb; i += blockDim.x) {
        const int32_t h = i / nb;
        qs_s[i] = h < p.num_heads
                      ? format_internal::ExactPow2(
                            static_cast<int32_t>(p.q_scales[(static_cast<int64_t>(lr) * p.num_heads + h) * nb + i % nb]) - 127)
                      : 0.f;
      }
    }
    __syncthreads();

    // ---- one entry per thread --------------------------------------------
    const int32_t e_end = min(u.e_end, n_r);
    for (int32_t pos = u.e_begin + threadIdx.x; pos < e_end; pos += blockDim.x) {
      const EntryRef ref = LocateEntry(l, p.pool, block_row, pos);
      float logit = 0.f;
      for (int32_t h0 = 0; h0 < hp; h0 += kHeadTile) {
        float acc[kHeadTile];
#pragma unroll
        for (int hh = 0; hh < kHeadTile; ++hh) acc[hh] = 0.f;
        for (int32_t b = 0; b < nb; ++b) {
          float kv[kMxBlock];
#pragma unroll
          for (int i = 0; i < kMxBlock; ++i) {
            const int32_t d = b * kMxBlock + i;
            kv[i] = kFmt == KvFormat::kFp8
                        ? DecodeCacheFp8<kVar>(ref.page[l.ValueOffset(ref.e, d)])
                        : DecodeE2m1(static_cast<uint8_t>(ref.page[l.ValueOffset(ref.e, d / 2)] >> ((i & 1) * 4)) & 0xf);
          }
          const float ks = kFmt == KvFormat::kFp8
                               ? 1.f
                               : format_internal::ExactPow2(static_cast<int32_t>(ref.page[l.ScaleOffset(ref.e, b)]) - 127);
#pragma unroll
          for (int hh = 0; hh < kHeadTile; ++hh) {
            const float* qh = q_s + (h0 + hh) * dim + b * kMxBlock;
            float part = 0.f;
#pragma unroll
            for (int i = 0; i < kMxBlock; ++i) part = fmaf(qh[i], kv[i], part);
            acc[hh] = kFmt == KvFormat::kFp8 ? acc[hh] + part
                                             : fmaf(part, ks * qs_s[(h0 + hh) * nb + b], acc[hh]);
          }
        }
#pragma unroll
        for (int hh = 0; hh < kHeadTile; ++hh) logit = fmaf(w_s[h0 + hh], fmaxf(acc[hh], 0.f), logit);
      }
      if (kFmt == KvFormat::kFp8) logit *= Fp8EntryScale(l, ref);
      p.logits[static_cast<int64_t>(lr) * p.stride + pos] = logit;
    }
  }
}

}  // namespace

absl::Status LaunchDenseLogitsPortable(const LogitsParams& p, Stream stream) {
  const int32_t units = p.unit_end - p.unit_begin;
  if (units == 0) return absl::OkStatus();
  const int64_t smem = PortableSmemBytes(p.num_heads, p.layout.head_dim);
  if (p.layout.format == KvFormat::kFp8 && p.layout.fp8 == Fp8Variant::kE4m3fnuz) {
    auto* kernel = &DenseLogitsPortableKernel<KvFormat::kFp8, Fp8Variant::kE4m3fnuz>;
    GPU_RETURN_IF_ERROR(SetMaxDynamicSmem(kernel, static_cast<int>(smem)));
    GPU_LAUNCH(kernel, units, kPortableThreads, smem, stream, p);
  } else if (p.layout.format == KvFormat::kFp8) {
    auto* kernel = &DenseLogitsPortableKernel<KvFormat::kFp8>;
    GPU_RETURN_IF_ERROR(SetMaxDynamicSmem(kernel, static_cast<int>(smem)));
    GPU_LAUNCH(kernel, units, kPortableThreads, smem, stream, p);
  } else {
    auto* kernel = &DenseLogitsPortableKernel<KvFormat::kMxfp4>;
    GPU_RETURN_IF_ERROR(SetMaxDynamicSmem(kernel, static_cast<int>(smem)));
    GPU_LAUNCH(kernel, units, kPortableThreads, smem, stream, p);
  }
  return absl::OkStatus();
}

}  // namespace gpu
}  // namespace indexer

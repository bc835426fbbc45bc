// The CUDA model of the wave64 primitives and MFMA instructions that
// gpu_compat.h declares (part of the compat seam: only gpu_compat.h includes
// this file, and only in a CUDA compile). A wave is two warps, threads
// [64w, 64w + 64) of the block; what crosses them goes through the wave's
// WaveScratch in shared memory, ordered by named barrier 1 + w over the
// wave's 64 threads (barrier 0 stays __syncthreads'; at most 15 waves a
// block).
//
// Each modelled MFMA takes every lane's operand fragment, scatters it to the
// matrix element the ISA's register table assigns to that lane and byte
// (mfma_lanes.h), and gives each lane back the accumulator elements the
// table assigns to its result GPRs. Numerics: operands decode exactly
// (FP8 in the variant the modelled device reads; FP4 e2m1 with E8M0 block
// scales applied as exact powers of two); each result element sums its K
// products in K order in fp32 (FP4: each 32-element block exactly, then the
// scaled blocks in order) and adds that sum to C. AMD does not document the
// matrix core's internal summation order and width, so the model matches
// the hardware bit for bit where every partial sum is exact in fp32 (what
// tests/gpu/mfma_model_test.cu checks bit for bit) and to fp32 summation
// error elsewhere.
#pragma once

#include <cmath>
#include <cstdint>

#include "kernels/gpu/amd/mfma_lanes.h"

namespace indexer {
namespace gpu {

// One wave's exchange area: the operand matrices of one MFMA (up to 32 x 64
// or 16 x 128 elements, one byte each), the E8M0 scales, one float a lane.
struct alignas(16) WaveScratch {
  uint8_t a[2048];
  uint8_t b[2048];
  uint8_t sa[64];
  uint8_t sb[64];
  float x[mfma::kWave];
};

// All 64 threads of this thread's wave meet here; shared-memory writes before
// it are visible to the wave's reads after it.
__device__ __forceinline__ void WaveSync(WaveScratch*) {
  asm volatile("bar.sync %0, %1;" ::"r"(1 + WaveIndex()), "r"(kWaveSize) : "memory");
}

// v of lane (WaveLane() ^ mask) of this wave.
__device__ __forceinline__ float WaveShflXor(float v, int mask, WaveScratch* s) {
  if (mask < 32) return __shfl_xor_sync(0xffffffffu, v, mask, 32);
  const int lane = WaveLane();
  s->x[lane] = v;
  WaveSync(s);
  const float r = s->x[lane ^ mask];
  WaveSync(s);
  return r;
}

namespace mfma_model {

// FP8 MFMA of layout L: operand byte b of each lane's 64-bit a / b.
template <class L, mfma::Fp8Kind kKind>
__device__ __forceinline__ void Fp8(uint64_t a, uint64_t b, float* acc, WaveScratch* s) {
  const int lane = WaveLane();
#pragma unroll
  for (int i = 0; i < L::kBytes; ++i) {
    const mfma::Elem ea = L::A(lane, i), eb = L::B(lane, i);
    s->a[ea.row * L::kK + ea.col] = static_cast<uint8_t>(a >> (8 * i));
    s->b[eb.row * L::kN + eb.col] = static_cast<uint8_t>(b >> (8 * i));
  }
  WaveSync(s);
#pragma unroll
  for (int v = 0; v < L::kRegs; ++v) {
    const mfma::Elem d = L::D(lane, v);
    float sum = 0.f;
    for (int k = 0; k < L::kK; ++k) {
      sum = fmaf(mfma::DecodeFp8Operand<kKind>(s->a[d.row * L::kK + k]),
                 mfma::DecodeFp8Operand<kKind>(s->b[k * L::kN + d.col]), sum);
    }
    acc[v] += sum;
  }
  WaveSync(s);  // before the scratch is written again
}

// Scaled FP4 MFMA of layout L (op_sel 0: each lane's scale in byte 0).
template <class L>
__device__ __forceinline__ void ScaleFp4(const uint32_t (&a)[4], const uint32_t (&b)[4], uint32_t sa, uint32_t sb,
                                         float* acc, WaveScratch* s) {
  constexpr int kBlocks = L::kK / 32;
  const int lane = WaveLane();
#pragma unroll
  for (int n = 0; n < L::kNibbles; ++n) {
    const mfma::Elem ea = L::A(lane, n), eb = L::B(lane, n);
    s->a[ea.row * L::kK + ea.col] = static_cast<uint8_t>((a[n / 8] >> (4 * (n % 8))) & 15u);
    s->b[eb.row * L::kN + eb.col] = static_cast<uint8_t>((b[n / 8] >> (4 * (n % 8))) & 15u);
  }
  const mfma::Elem sc = L::Scale(lane);
  s->sa[sc.row * kBlocks + sc.col] = static_cast<uint8_t>(sa & 0xffu);
  s->sb[sc.row * kBlocks + sc.col] = static_cast<uint8_t>(sb & 0xffu);
  WaveSync(s);
#pragma unroll
  for (int v = 0; v < L::kRegs; ++v) {
    const mfma::Elem d = L::D(lane, v);
    float sum = 0.f;
    for (int kb = 0; kb < kBlocks; ++kb) {
      float part = 0.f;  // exact: 32 products of e2m1 values, multiples of 1/4 up to 36
      for (int k = 32 * kb; k < 32 * kb + 32; ++k) {
        part += mfma::DecodeFp4Operand(s->a[d.row * L::kK + k]) * mfma::DecodeFp4Operand(s->b[k * L::kN + d.col]);
      }
      const int ea = s->sa[d.row * kBlocks + kb], eb = s->sb[d.col * kBlocks + kb];
      sum += (ea == 255 || eb == 255) ? __int_as_float(0x7fc00000) : ldexpf(part, ea + eb - 254);
    }
    acc[v] += sum;
  }
  WaveSync(s);
}

}  // namespace mfma_model

template <mfma::Fp8Kind kKind>
__device__ __forceinline__ void MfmaFp8x32x32x16(uint64_t a, uint64_t b, MfmaAcc16& acc, WaveScratch* s) {
  mfma_model::Fp8<mfma::Fp8x32x32x16, kKind>(a, b, acc.v, s);
}
template <mfma::Fp8Kind kKind>
__device__ __forceinline__ void MfmaFp8x16x16x32(uint64_t a, uint64_t b, MfmaAcc4& acc, WaveScratch* s) {
  mfma_model::Fp8<mfma::Fp8x16x16x32, kKind>(a, b, acc.v, s);
}
__device__ __forceinline__ void MfmaScaleFp4x32x32x64(const uint32_t (&a)[4], const uint32_t (&b)[4], uint32_t sa,
                                                      uint32_t sb, MfmaAcc16& acc, WaveScratch* s) {
  mfma_model::ScaleFp4<mfma::Fp4x32x32x64>(a, b, sa, sb, acc.v, s);
}
__device__ __forceinline__ void MfmaScaleFp4x16x16x128(const uint32_t (&a)[4], const uint32_t (&b)[4], uint32_t sa,
                                                       uint32_t sb, MfmaAcc4& acc, WaveScratch* s) {
  mfma_model::ScaleFp4<mfma::Fp4x16x16x128>(a, b, sa, sb, acc.v, s);
}

}  // namespace gpu
}  // namespace indexer

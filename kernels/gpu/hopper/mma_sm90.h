// Tensor-core building blocks of the sm_89+/sm_90 logits kernels: the
// m16n8k32 e4m3 mma.sync and the exact e2m1 -> e4m3 widening; for the
// block path the m16n8k16 fp16 mma.sync and e2m1 -> fp16. Device code
// for INDEXER_GPU_MMA_FP8 passes only; include after gpu_compat.h.
#pragma once

#include <cstdint>

#include "kernels/gpu/gpu_compat.h"

#if INDEXER_GPU_MMA_FP8
namespace indexer {
namespace gpu {

// c[16x8] += a[16x32] * b[32x8], e4m3 in, fp32 accumulate. Fragments
// (g = lane / 4, t = lane % 4): a0/a2 row g, a1/a3 row g + 8, k columns
// t*4..+3 (a0, a1) and 16 + t*4..+3 (a2, a3); b0 k t*4..+3, b1 k 16 + t*4..
// +3, column g; c0, c1 row g, columns 2t, 2t+1; c2, c3 row g + 8.
__device__ __forceinline__ void MmaE4m3(float (&c)[4], uint32_t a0,
                                        uint32_t a1, uint32_t a2, uint32_t a3,
                                        uint32_t b0, uint32_t b1) {
  asm volatile(
      "mma.sync.aligned.m16n8k32.row.col.f32.e4m3.e4m3.f32 "
      "{%0, %1, %2, %3}, {%4, %5, %6, %7}, {%8, %9}, {%0, %1, %2, %3};\n"
      : "+f"(c[0]), "+f"(c[1]), "+f"(c[2]), "+f"(c[3])
      : "r"(a0), "r"(a1), "r"(a2), "r"(a3), "r"(b0), "r"(b1));
}

// Eight e2m1 nibbles (element 2i in the low nibble of byte i) widened to
// eight e4m3 codes, exactly (every e2m1 value is an e4m3 value): elements
// 0..3 in .x, 4..7 in .y. Magnitudes through a byte permute of the table
// {0, .5, 1, 1.5, 2, 3, 4, 6}, signs moved to bit 7.
__device__ __forceinline__ uint2 WidenE2m1(uint32_t w) {
  constexpr uint32_t kLutLo = 0x3c383000u;  // codes of 0, .5, 1, 1.5
  constexpr uint32_t kLutHi = 0x4c484440u;  // codes of 2, 3, 4, 6
  uint2 r;
  r.x = __byte_perm(kLutLo, kLutHi, w & 0x7777u) |
        __byte_perm(0u, 0x80808080u, (w >> 1) & 0x4444u);
  const uint32_t h = w >> 16;
  r.y = __byte_perm(kLutLo, kLutHi, h & 0x7777u) |
        __byte_perm(0u, 0x80808080u, (h >> 1) & 0x4444u);
  return r;
}

// c[16x8] += a[16x16] * b[16x8], fp16 in, fp32 accumulate (the block
// path). Fragments (g = lane / 4, t = lane % 4): a0 row g, k 2t..2t+1; a1
// row g + 8, same k; a2 row g, k 2t+8..+9; a3 row g + 8, same k; b0 k
// 2t..2t+1, b1 k 2t+8..+9, column g; c as MmaE4m3. The lower k in the
// lower half.
__device__ __forceinline__ void MmaF16(float (&c)[4], uint32_t a0, uint32_t a1, uint32_t a2,
                                       uint32_t a3, uint32_t b0, uint32_t b1) {
  asm volatile(
      "mma.sync.aligned.m16n8k16.row.col.f32.f16.f16.f32 "
      "{%0, %1, %2, %3}, {%4, %5, %6, %7}, {%8, %9}, {%0, %1, %2, %3};\n"
      : "+f"(c[0]), "+f"(c[1]), "+f"(c[2]), "+f"(c[3])
      : "r"(a0), "r"(a1), "r"(a2), "r"(a3), "r"(b0), "r"(b1));
}

// Four e2m1 nibbles (bits 0..15 of x, element i in nibble i) widened
// exactly to four fp16 values, elements 0, 1 in .x (element 0 low) and 2, 3
// in .y. The e5m2 code of an e2m1 value is the high byte of its fp16 (low
// byte 0): magnitudes through a byte permute of the e5m2 codes of {0, .5,
// 1, 1.5, 2, 3, 4, 6}, signs to bit 7, then each code to its half's high
// byte.
__device__ __forceinline__ uint2 WidenE2m1ToHalf4(uint32_t x) {
  const uint32_t b = __byte_perm(0x3e3c3800u, 0x46444240u, x & 0x7777u) |
                     __byte_perm(0u, 0x80808080u, (x >> 1) & 0x4444u);
  return make_uint2(__byte_perm(b, 0u, 0x1404), __byte_perm(b, 0u, 0x3424));
}

// fp32 -> fp16 bits, round to nearest even, and back (exact).
__device__ __forceinline__ uint16_t F32ToF16Rn(float x) {
  uint16_t h;
  asm("cvt.rn.f16.f32 %0, %1;\n" : "=h"(h) : "f"(x));
  return h;
}
__device__ __forceinline__ float F16ToF32(uint16_t h) {
  float x;
  asm("cvt.f32.f16 %0, %1;\n" : "=f"(x) : "h"(h));
  return x;
}

}  // namespace gpu
}  // namespace indexer
#endif  // INDEXER_GPU_MMA_FP8

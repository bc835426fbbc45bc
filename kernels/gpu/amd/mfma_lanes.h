// Register layouts of the AMD MFMA instructions the wave64 logits kernels use:
// which matrix element each lane's operand bytes (or nibbles) hold and which
// accumulator element each lane's result register holds. Plain host+device
// functions (no vendor code): the kernels load fragments through them, the
// CUDA instruction model (mfma_model.h) scatters and gathers through them,
// and tests/unit/mfma_lanes_test.cc checks them on the host.
//
// Sources (all element indices 0-based; A is M x K, B is K x N, D is M x N):
//  * CDNA3 (gfx942), "AMD Instinct MI300 ISA Reference Guide", §7.1
//    "Dependent Arithmetic Instructions: MFMA", the register layouts of
//    V_MFMA_F32_32X32X16_FP8_FP8 and V_MFMA_F32_16X16X32_FP8_FP8, as
//    AMD's matrix instruction calculator prints them
//    (github.com/ROCm/amd_matrix_instruction_calculator at 2ef9189,
//    `matrix_calculator.py -a cdna3 -i v_mfma_f32_32x32x16_fp8_fp8 -d`):
//      32x32x16  A[i][k]: lane 32*floor(k/8) + i, GPR floor(k/4)%2, byte k%4
//                B[k][j]: lane 32*floor(k/8) + j, same GPR / byte
//                D[i][j]: lane (32*floor(i/4))%64 + j, GPR 4*floor(i/8) + i%4
//      16x16x32  A[i][k]: lane 16*floor(k/8) + i, GPR floor(k/4)%2, byte k%4
//                B[k][j]: lane 16*floor(k/8) + j
//                D[i][j]: lane 16*floor(i/4) + j, GPR i%4
//    The 64-bit operand is two GPRs, so "GPR g, byte b" is operand byte
//    4g + b = k % 8. The same instructions on gfx950 (CDNA4) keep these
//    layouts and read OCP e4m3 instead of e4m3fnuz (CDNA4 ISA §7.1).
//  * CDNA4 (gfx950), "AMD Instinct MI355X ISA Reference Guide" §7.2.1
//    "MFMA with Block Exponent Scaling", V_MFMA_SCALE_F32_32X32X64_F8F6F4 and
//    V_MFMA_SCALE_F32_16X16X128_F8F6F4 with FP4 (e2m1) operands (cbsz = blgp
//    = 4): each lane holds 32 consecutive K elements of one row of A (one
//    column of B) in the low 16 bytes of its 8-GPR operand, element 2n in the
//    low nibble of byte n, and supplies the E8M0 scale of exactly those 32
//    elements (one MX block):
//      32x32x64   A[i][k]: lane 32*floor(k/32) + i, nibble k%32
//                 B[k][j]: lane 32*floor(k/32) + j, nibble k%32
//                 scaleA[i][k/32]: lane 32*floor(k/32) + i (scaleB likewise)
//                 D: the 32x32 layout above
//      16x16x128  A[i][k]: lane 16*floor(k/32) + i, nibble k%32
//                 B[k][j]: lane 16*floor(k/32) + j; scales likewise
//                 D: the 16x16 layout above
//    The calculator has no CDNA4 tables yet (its issue #7); these were read
//    from the ISA guide and agree with AMD's own hardware test of the
//    builtins (ROCm/aiter op_tests/opus/device/test_mfma_scale.cu: A row
//    lane%32, 16 contiguous bytes at byte offset 16*floor(lane/32); C stored
//    as the 32x32 layout) and with AMD's blog "Matrix Core Programming on
//    AMD CDNA3 and CDNA4 architecture" (rocm.blogs.amd.com, 2025).
#pragma once

#include <cstdint>

#include "kernels/format/hd.h"

namespace indexer {
namespace gpu {
namespace mfma {

inline constexpr int kWave = 64;  // lanes of a CDNA wavefront

// A matrix element: (row, col) of A (i, k), of B (k, j) or of D (i, j).
struct Elem {
  int32_t row;
  int32_t col;
};

// ---- v_mfma_f32_32x32x16_fp8_fp8: 8 operand bytes, 16 result GPRs ------------
struct Fp8x32x32x16 {
  static constexpr int kM = 32, kN = 32, kK = 16;
  static constexpr int kBytes = 8;   // operand bytes per lane (2 GPRs)
  static constexpr int kRegs = 16;   // accumulator GPRs per lane
  // Operand byte `b` of `lane`: A[i][k].
  INDEXER_HD static Elem A(int lane, int b) { return {lane % 32, 8 * (lane / 32) + b}; }
  // Operand byte `b` of `lane`: B[k][j].
  INDEXER_HD static Elem B(int lane, int b) { return {8 * (lane / 32) + b, lane % 32}; }
  // Accumulator GPR `v` of `lane`: D[i][j].
  INDEXER_HD static Elem D(int lane, int v) {
    return {8 * (v / 4) + 4 * (lane / 32) + v % 4, lane % 32};
  }
};

// ---- v_mfma_f32_16x16x32_fp8_fp8: 8 operand bytes, 4 result GPRs --------------
struct Fp8x16x16x32 {
  static constexpr int kM = 16, kN = 16, kK = 32;
  static constexpr int kBytes = 8;
  static constexpr int kRegs = 4;
  INDEXER_HD static Elem A(int lane, int b) { return {lane % 16, 8 * (lane / 16) + b}; }
  INDEXER_HD static Elem B(int lane, int b) { return {8 * (lane / 16) + b, lane % 16}; }
  INDEXER_HD static Elem D(int lane, int v) { return {4 * (lane / 16) + v, lane % 16}; }
};

// ---- v_mfma_scale_f32_32x32x64_f8f6f4, FP4 operands: 32 nibbles ---------------
struct Fp4x32x32x64 {
  static constexpr int kM = 32, kN = 32, kK = 64;
  static constexpr int kNibbles = 32;  // operand nibbles per lane (GPRs 0..3)
  static constexpr int kRegs = 16;
  INDEXER_HD static Elem A(int lane, int n) { return {lane % 32, 32 * (lane / 32) + n}; }
  INDEXER_HD static Elem B(int lane, int n) { return {32 * (lane / 32) + n, lane % 32}; }
  // The E8M0 scale `lane` supplies: (row of A or column of B, K block).
  INDEXER_HD static Elem Scale(int lane) { return {lane % 32, lane / 32}; }
  INDEXER_HD static Elem D(int lane, int v) { return Fp8x32x32x16::D(lane, v); }
};

// ---- v_mfma_scale_f32_16x16x128_f8f6f4, FP4 operands --------------------------
struct Fp4x16x16x128 {
  static constexpr int kM = 16, kN = 16, kK = 128;
  static constexpr int kNibbles = 32;
  static constexpr int kRegs = 4;
  INDEXER_HD static Elem A(int lane, int n) { return {lane % 16, 32 * (lane / 16) + n}; }
  INDEXER_HD static Elem B(int lane, int n) { return {32 * (lane / 16) + n, lane % 16}; }
  INDEXER_HD static Elem Scale(int lane) { return {lane % 16, lane / 16}; }
  INDEXER_HD static Elem D(int lane, int v) { return Fp8x16x16x32::D(lane, v); }
};

// How the matrix core reads an FP8 operand byte: gfx942 e4m3fnuz (bias 8, max
// 240, 0x80 NaN, no negative zero), gfx950 OCP e4m3 (bias 7, max 448,
// 0x7f/0xff NaN). Exact: every code is a small integer times a power of two.
enum class Fp8Kind : int32_t { kFn = 0, kFnuz = 1 };

INDEXER_HD float Pow2(int e) {  // exact for -149 <= e <= 127
  if (e < -126) return static_cast<float>(1u << (e + 149)) * 1.40129846e-45f;  // 2^-149 units
  union {
    uint32_t u;
    float f;
  } x;
  x.u = static_cast<uint32_t>(e + 127) << 23;
  return x.f;
}

template <Fp8Kind kKind>
INDEXER_HD float DecodeFp8Operand(uint8_t code) {
  const int e = (code >> 3) & 15, m = code & 7;
  const float sign = (code & 0x80) ? -1.f : 1.f;
  if (kKind == Fp8Kind::kFnuz) {
    if (code == 0x80) return __builtin_nanf("");
    return e == 0 ? sign * static_cast<float>(m) * Pow2(-10)
                  : sign * static_cast<float>(8 + m) * Pow2(e - 11);
  }
  if ((code & 0x7f) == 0x7f) return __builtin_nanf("");
  return e == 0 ? sign * static_cast<float>(m) * Pow2(-9) : sign * static_cast<float>(8 + m) * Pow2(e - 10);
}

// e2m1: magnitudes {0, .5, 1, 1.5, 2, 3, 4, 6}, bit 3 the sign.
INDEXER_HD float DecodeFp4Operand(uint8_t nib) {
  const int e = (nib >> 1) & 3, m = nib & 1;
  const float mag = e == 0 ? 0.5f * m : static_cast<float>(2 + m) * Pow2(e - 2);
  return (nib & 8) ? -mag : mag;
}

}  // namespace mfma
}  // namespace gpu
}  // namespace indexer

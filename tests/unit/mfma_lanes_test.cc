// The MFMA register tables of kernels/gpu/amd/mfma_lanes.h on the host (no
// GPU): every table is a bijection between (lane, operand byte / nibble /
// result GPR) and the matrix elements; each agrees, element by element, with
// the element-to-register formulas AMD's matrix instruction calculator
// prints (ROCm/amd_matrix_instruction_calculator 2ef9189, CDNA3) or the
// CDNA4 ISA guide states (scaled FP4), written here independently as
// inverses; and a few cells copied from the calculator's printed tables
// (`-R -A/-B/-D`) pin the orientation. The operand decoders match the
// project's codecs (and e4m3fnuz its definition: half the OCP value).
#include <cmath>
#include <cstdint>
#include <set>
#include <utility>

#include "gtest/gtest.h"
#include "kernels/format/fp8.h"
#include "kernels/format/mxfp4.h"
#include "kernels/gpu/amd/mfma_lanes.h"

namespace indexer {
namespace gpu {
namespace mfma {
namespace {

bool Eq(Elem a, Elem b) { return a.row == b.row && a.col == b.col; }

// Every (lane, slot) maps into rows x cols and no element twice.
template <class F>
void ExpectBijection(F f, int slots, int rows, int cols, const char* what) {
  std::set<std::pair<int, int>> seen;
  for (int lane = 0; lane < kWave; ++lane) {
    for (int s = 0; s < slots; ++s) {
      const Elem e = f(lane, s);
      ASSERT_TRUE(e.row >= 0 && e.row < rows && e.col >= 0 && e.col < cols)
          << what << " lane " << lane << " slot " << s << " -> (" << e.row << ", " << e.col << ")";
      ASSERT_TRUE(seen.insert({e.row, e.col}).second) << what << " element (" << e.row << ", " << e.col << ") twice";
    }
  }
  EXPECT_EQ(static_cast<int>(seen.size()), rows * cols) << what;
}

TEST(MfmaLanesTest, TablesAreBijections) {
  using A = Fp8x32x32x16;
  using C = Fp8x16x16x32;
  using F = Fp4x32x32x64;
  using G = Fp4x16x16x128;
  ExpectBijection(A::A, A::kBytes, A::kM, A::kK, "32x32x16 A");
  ExpectBijection(A::B, A::kBytes, A::kK, A::kN, "32x32x16 B");
  ExpectBijection(A::D, A::kRegs, A::kM, A::kN, "32x32 D");
  ExpectBijection(C::A, C::kBytes, C::kM, C::kK, "16x16x32 A");
  ExpectBijection(C::B, C::kBytes, C::kK, C::kN, "16x16x32 B");
  ExpectBijection(C::D, C::kRegs, C::kM, C::kN, "16x16 D");
  ExpectBijection(F::A, F::kNibbles, F::kM, F::kK, "32x32x64 A");
  ExpectBijection(F::B, F::kNibbles, F::kK, F::kN, "32x32x64 B");
  ExpectBijection(G::A, G::kNibbles, G::kM, G::kK, "16x16x128 A");
  ExpectBijection(G::B, G::kNibbles, G::kK, G::kN, "16x16x128 B");
  ExpectBijection([](int lane, int) { return F::Scale(lane); }, 1, F::kM, F::kK / 32, "32x32x64 scales");
  ExpectBijection([](int lane, int) { return G::Scale(lane); }, 1, G::kM, G::kK / 32, "16x16x128 scales");
}

// The calculator's "Matrix element to register mapping" (CDNA3):
//   32x32x16  A[i][k] / B[k][i]: GPR floor(k/4)%2, bits 8*(k%4), lane 32*floor(k/8) + i
//             D[i][j]: GPR 4*floor(i/8) + i%4, lane (32*floor(i/4))%64 + j
//   16x16x32  A[i][k] / B[k][i]: lane 16*floor(k/8) + i
//             D[i][j]: GPR i%4, lane 16*floor(i/4) + j
// The 64-bit operand's byte is 4 * GPR + (bits / 8).
TEST(MfmaLanesTest, Fp8TablesMatchTheCalculator) {
  for (int i = 0; i < 32; ++i) {
    for (int k = 0; k < 16; ++k) {
      const int lane = 32 * (k / 8) + i, byte = 4 * ((k / 4) % 2) + k % 4;
      EXPECT_TRUE(Eq(Fp8x32x32x16::A(lane, byte), {i, k})) << "32x32x16 A[" << i << "][" << k << "]";
      EXPECT_TRUE(Eq(Fp8x32x32x16::B(lane, byte), {k, i})) << "32x32x16 B[" << k << "][" << i << "]";
    }
    for (int j = 0; j < 32; ++j) {
      const int lane = (32 * (i / 4)) % 64 + j, gpr = 4 * (i / 8) + i % 4;
      EXPECT_TRUE(Eq(Fp8x32x32x16::D(lane, gpr), {i, j})) << "32x32 D[" << i << "][" << j << "]";
    }
  }
  for (int i = 0; i < 16; ++i) {
    for (int k = 0; k < 32; ++k) {
      const int lane = 16 * (k / 8) + i, byte = 4 * ((k / 4) % 2) + k % 4;
      EXPECT_TRUE(Eq(Fp8x16x16x32::A(lane, byte), {i, k})) << "16x16x32 A[" << i << "][" << k << "]";
      EXPECT_TRUE(Eq(Fp8x16x16x32::B(lane, byte), {k, i})) << "16x16x32 B[" << k << "][" << i << "]";
    }
    for (int j = 0; j < 16; ++j) {
      EXPECT_TRUE(Eq(Fp8x16x16x32::D(16 * (i / 4) + j, i % 4), {i, j})) << "16x16 D[" << i << "][" << j << "]";
    }
  }
}

// Cells of the calculator's printed tables, "v<GPR>{<lane>}.[bits]".
TEST(MfmaLanesTest, CalculatorCells) {
  // -i v_mfma_f32_32x32x16_fp8_fp8 -R -A: A[0][8] = v0{32}.[7:0], A[11][15] = v1{43}.[31:24]
  EXPECT_TRUE(Eq(Fp8x32x32x16::A(32, 0), {0, 8}));
  EXPECT_TRUE(Eq(Fp8x32x32x16::A(43, 7), {11, 15}));
  EXPECT_TRUE(Eq(Fp8x32x32x16::A(5, 6), {5, 6}));  // A[5][6] = v1{5}.[23:16]
  // -R -D: D[4][0] = v0{32}, D[4][30] = v0{62}, D[8][30] = v4{30}, D[13][30] = v5{62}, D[31][30] = v15{62}
  EXPECT_TRUE(Eq(Fp8x32x32x16::D(32, 0), {4, 0}));
  EXPECT_TRUE(Eq(Fp8x32x32x16::D(62, 0), {4, 30}));
  EXPECT_TRUE(Eq(Fp8x32x32x16::D(30, 4), {8, 30}));
  EXPECT_TRUE(Eq(Fp8x32x32x16::D(62, 5), {13, 30}));
  EXPECT_TRUE(Eq(Fp8x32x32x16::D(62, 15), {31, 30}));
  // -i v_mfma_f32_16x16x32_fp8_fp8 -R -D: D[0][15] = v0{15}, D[5][0] = v1{16}, D[15][0] = v3{48}
  EXPECT_TRUE(Eq(Fp8x16x16x32::D(15, 0), {0, 15}));
  EXPECT_TRUE(Eq(Fp8x16x16x32::D(16, 1), {5, 0}));
  EXPECT_TRUE(Eq(Fp8x16x16x32::D(48, 3), {15, 0}));
  // -R -B: B[9][0] = v0{16}.[15:8], B[31][15] = v1{63}.[31:24]
  EXPECT_TRUE(Eq(Fp8x16x16x32::B(16, 1), {9, 0}));
  EXPECT_TRUE(Eq(Fp8x16x16x32::B(63, 7), {31, 15}));
}

// CDNA4 ISA §7.2.1, FP4 operands of the scaled MFMAs: A[i][k] in lane
// M * floor(k/32) + i, nibble k % 32 (byte (k%32)/2, low nibble first);
// the lane's scale is that (row, K block)'s; D as the unscaled shapes.
TEST(MfmaLanesTest, Fp4TablesMatchTheIsa) {
  for (int i = 0; i < 32; ++i) {
    for (int k = 0; k < 64; ++k) {
      EXPECT_TRUE(Eq(Fp4x32x32x64::A(32 * (k / 32) + i, k % 32), {i, k}));
      EXPECT_TRUE(Eq(Fp4x32x32x64::B(32 * (k / 32) + i, k % 32), {k, i}));
    }
    for (int kb = 0; kb < 2; ++kb) EXPECT_TRUE(Eq(Fp4x32x32x64::Scale(32 * kb + i), {i, kb}));
  }
  for (int i = 0; i < 16; ++i) {
    for (int k = 0; k < 128; ++k) {
      EXPECT_TRUE(Eq(Fp4x16x16x128::A(16 * (k / 32) + i, k % 32), {i, k}));
      EXPECT_TRUE(Eq(Fp4x16x16x128::B(16 * (k / 32) + i, k % 32), {k, i}));
    }
    for (int kb = 0; kb < 4; ++kb) EXPECT_TRUE(Eq(Fp4x16x16x128::Scale(16 * kb + i), {i, kb}));
  }
  for (int lane = 0; lane < kWave; ++lane) {
    for (int v = 0; v < 16; ++v) EXPECT_TRUE(Eq(Fp4x32x32x64::D(lane, v), Fp8x32x32x16::D(lane, v)));
    for (int v = 0; v < 4; ++v) EXPECT_TRUE(Eq(Fp4x16x16x128::D(lane, v), Fp8x16x16x32::D(lane, v)));
  }
}

TEST(MfmaLanesTest, OperandDecoders) {
  for (int c = 0; c < 256; ++c) {
    const uint8_t code = static_cast<uint8_t>(c);
    const float fn = DecodeFp8Operand<Fp8Kind::kFn>(code), fnuz = DecodeFp8Operand<Fp8Kind::kFnuz>(code);
    if ((c & 0x7f) == 0x7f) {
      EXPECT_TRUE(std::isnan(fn)) << c;
      EXPECT_EQ(fnuz, c == 0x7f ? 240.f : -240.f) << c;  // e4m3fnuz max
      continue;
    }
    EXPECT_EQ(fn, DecodeE4m3(code)) << c;
    if (c == 0x80) {
      EXPECT_TRUE(std::isnan(fnuz));  // the one fnuz NaN
    } else {
      EXPECT_EQ(fnuz, DecodeE4m3(code) / 2) << c;  // bias 8: half the OCP value, subnormals too
    }
  }
  EXPECT_EQ(DecodeFp8Operand<Fp8Kind::kFnuz>(0x01), std::ldexp(1.f, -10));  // smallest fnuz subnormal
  for (int n = 0; n < 16; ++n) EXPECT_EQ(DecodeFp4Operand(static_cast<uint8_t>(n)), DecodeE2m1(static_cast<uint8_t>(n))) << n;
}

}  // namespace
}  // namespace mfma
}  // namespace gpu
}  // namespace indexer

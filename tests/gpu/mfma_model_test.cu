// The MFMA calls of the compat seam (gpu_compat.h) against a plain matrix
// product, for every instruction and operand type the wave64 kernels use:
// on CUDA the instruction model (kernels/gpu/amd/mfma_model.h), on a gfx942 /
// gfx950 device the instructions themselves. The test kernels build each
// lane's fragments and read its accumulators with the element-to-register
// formulas of AMD's documents, written here on their own (the calculator's
// "Matrix element to register mapping", CDNA3; CDNA4 ISA §7.2.1 for the
// scaled FP4 shapes), not through mfma_lanes.h. Two waves a block, each its
// own problem, so the model's per-wave barriers and scratch are exercised.
//   * exact inputs (every partial sum representable in fp32): bit for bit;
//   * full-range inputs: within fp32 summation error of a float64 product;
//   * an E8M0 scale of 0xff (NaN) poisons exactly its row / column; scale
//     bytes 1..3 (op_sel 0) are ignored.
// Also the wave exchanges (WaveShflXor over all masks, within and across the
// two warps of a modelled wave). Skips without a GPU or an instruction the
// device lacks.
#include "kernels/gpu/gpu_compat.h"  // first: the runtime defines __device__ & co.

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <random>
#include <string>
#include <vector>

#include "gtest/gtest.h"
#include "kernels/gpu/gpu_backend.h"

namespace indexer {
namespace gpu {
namespace {

constexpr int kWavesPerBlock = 2;

enum class Inst : int { k32x32x16 = 0, k16x16x32 = 1, kScale32x32x64 = 2, kScale16x16x128 = 3 };

struct Dims {
  int m, n, k;
};
__host__ __device__ constexpr Dims DimsOf(Inst i) {
  return i == Inst::k32x32x16 ? Dims{32, 32, 16}
         : i == Inst::k16x16x32 ? Dims{16, 16, 32}
         : i == Inst::kScale32x32x64 ? Dims{32, 32, 64}
                                     : Dims{16, 16, 128};
}
__host__ __device__ constexpr bool Scaled(Inst i) { return i == Inst::kScale32x32x64 || i == Inst::kScale16x16x128; }

// Element -> (lane, slot) per the documents. FP8: slot = operand byte =
// 4 * GPR + bits / 8, lane M*floor(k/8) + row. FP4: slot = nibble k % 32,
// lane M*floor(k/32) + row. D: (lane, GPR).
__device__ void OperandSlot(Inst inst, int row, int k, int* lane, int* slot) {
  const int m = DimsOf(inst).m;
  if (Scaled(inst)) {
    *lane = m * (k / 32) + row;
    *slot = k % 32;
  } else {
    *lane = m * (k / 8) + row;
    *slot = 4 * ((k / 4) % 2) + k % 4;
  }
}
__device__ void ResultSlot(Inst inst, int i, int j, int* lane, int* gpr) {
  if (DimsOf(inst).m == 32) {
    *lane = (32 * (i / 4)) % 64 + j;
    *gpr = 4 * (i / 8) + i % 4;
  } else {
    *lane = 16 * (i / 4) + j;
    *gpr = i % 4;
  }
}

// One problem per wave: A [m, k] codes, B [k, n] codes, scales sa [m, k/32]
// and sb [n, k/32] (scaled shapes), C and D [m, n].
template <Inst kInst, mfma::Fp8Kind kKind>
__global__ void MfmaKernel(const uint8_t* A, const uint8_t* B, const uint8_t* sa, const uint8_t* sb,
                           const uint32_t* scale_high, const float* C, float* D) {
  constexpr Dims d = DimsOf(kInst);
  constexpr int kRegs = d.m == 32 ? 16 : 4;
  __shared__ WaveScratch scratch[kWavesPerBlock];
  const int wave = WaveIndex(), lane = WaveLane();
  const int prob = blockIdx.x * kWavesPerBlock + wave;
  A += static_cast<int64_t>(prob) * d.m * d.k;
  B += static_cast<int64_t>(prob) * d.k * d.n;
  C += static_cast<int64_t>(prob) * d.m * d.n;
  D += static_cast<int64_t>(prob) * d.m * d.n;
  uint8_t a[32] = {}, b[32] = {};
  for (int r = 0; r < d.m; ++r) {
    for (int k = 0; k < d.k; ++k) {
      int l, s;
      OperandSlot(kInst, r, k, &l, &s);
      if (l == lane) a[s] = A[r * d.k + k];
      OperandSlot(kInst, r, k, &l, &s);  // B[k][j] with j in the row's place
      if (l == lane) b[s] = B[k * d.n + r];
    }
  }
  float acc[kRegs];
  for (int i = 0; i < d.m; ++i) {
    for (int j = 0; j < d.n; ++j) {
      int l, g;
      ResultSlot(kInst, i, j, &l, &g);
      if (l == lane) acc[g] = C[i * d.n + j];
    }
  }
  if constexpr (Scaled(kInst)) {
    uint32_t a4[4] = {}, b4[4] = {};
    for (int n = 0; n < 32; ++n) {
      a4[n / 8] |= static_cast<uint32_t>(a[n] & 15) << (4 * (n % 8));
      b4[n / 8] |= static_cast<uint32_t>(b[n] & 15) << (4 * (n % 8));
    }
    // The lane's scale: row lane % M, K block lane / M (CDNA4 §7.2.1);
    // bytes 1..3 carry junk that op_sel 0 must ignore.
    const int blocks = d.k / 32, row = lane % d.m, kb = lane / d.m;
    const uint32_t hi = scale_high[lane] & 0xffffff00u;
    const uint32_t sav = hi | sa[(static_cast<int64_t>(prob) * d.m + row) * blocks + kb];
    const uint32_t sbv = hi | sb[(static_cast<int64_t>(prob) * d.n + row) * blocks + kb];
    if constexpr (kRegs == 16) {
      MfmaAcc16 c;
      for (int v = 0; v < 16; ++v) c.v[v] = acc[v];
      MfmaScaleFp4x32x32x64(a4, b4, sav, sbv, c, scratch + wave);
      for (int v = 0; v < 16; ++v) acc[v] = c.v[v];
    } else {
      MfmaAcc4 c;
      for (int v = 0; v < 4; ++v) c.v[v] = acc[v];
      MfmaScaleFp4x16x16x128(a4, b4, sav, sbv, c, scratch + wave);
      for (int v = 0; v < 4; ++v) acc[v] = c.v[v];
    }
  } else {
    uint64_t a8 = 0, b8 = 0;
    for (int i = 0; i < 8; ++i) {
      a8 |= static_cast<uint64_t>(a[i]) << (8 * i);
      b8 |= static_cast<uint64_t>(b[i]) << (8 * i);
    }
    if constexpr (kRegs == 16) {
      MfmaAcc16 c;
      for (int v = 0; v < 16; ++v) c.v[v] = acc[v];
      MfmaFp8x32x32x16<kKind>(a8, b8, c, scratch + wave);
      for (int v = 0; v < 16; ++v) acc[v] = c.v[v];
    } else {
      MfmaAcc4 c;
      for (int v = 0; v < 4; ++v) c.v[v] = acc[v];
      MfmaFp8x16x16x32<kKind>(a8, b8, c, scratch + wave);
      for (int v = 0; v < 4; ++v) acc[v] = c.v[v];
    }
  }
  for (int i = 0; i < d.m; ++i) {
    for (int j = 0; j < d.n; ++j) {
      int l, g;
      ResultSlot(kInst, i, j, &l, &g);
      if (l == lane) D[i * d.n + j] = acc[g];
    }
  }
}

__global__ void ShflKernel(float* out) {
  __shared__ WaveScratch scratch[kWavesPerBlock];
  const int wave = WaveIndex(), lane = WaveLane();
  const float v = static_cast<float>(1000 * (blockIdx.x * kWavesPerBlock + wave) + lane);
  for (int bit = 0; bit < 6; ++bit) {
    out[(static_cast<int64_t>(blockIdx.x * kWavesPerBlock + wave) * 6 + bit) * kWaveSize + lane] =
        WaveShflXor(v, 1 << bit, scratch + wave);
  }
}

// ---- host -------------------------------------------------------------------

double DecodeFp8(uint8_t c, mfma::Fp8Kind kind) {
  return kind == mfma::Fp8Kind::kFn ? mfma::DecodeFp8Operand<mfma::Fp8Kind::kFn>(c)
                                    : mfma::DecodeFp8Operand<mfma::Fp8Kind::kFnuz>(c);
}

struct Problem {
  std::vector<uint8_t> a, b, sa, sb;
  std::vector<uint32_t> scale_high;
  std::vector<float> c;
};

// Codes: `exact` keeps FP8 to exponent fields 7..11 (values 2^-3 .. 30) and
// FP4 scales to 125..129 so that every sum is exact in fp32.
Problem MakeProblem(Inst inst, int probs, bool exact, mfma::Fp8Kind kind, std::mt19937& rng) {
  const Dims d = DimsOf(inst);
  Problem p;
  std::uniform_int_distribution<int> byte(0, 255), nib(0, 15), sign(0, 1), e(7, 11), m(0, 7);
  std::uniform_int_distribution<int> cint(-100, 100);
  auto code = [&]() -> uint8_t {
    if (Scaled(inst)) return static_cast<uint8_t>(nib(rng));
    if (exact) return static_cast<uint8_t>((sign(rng) << 7) | (e(rng) << 3) | m(rng));
    for (;;) {
      const int c = byte(rng);
      const bool nan = kind == mfma::Fp8Kind::kFn ? (c & 0x7f) == 0x7f : c == 0x80;
      if (!nan) return static_cast<uint8_t>(c);
    }
  };
  p.a.resize(static_cast<size_t>(probs) * d.m * d.k);
  p.b.resize(static_cast<size_t>(probs) * d.k * d.n);
  for (auto& x : p.a) x = code();
  for (auto& x : p.b) x = code();
  std::uniform_int_distribution<int> sc(exact ? 125 : 100, exact ? 129 : 150);
  p.sa.resize(static_cast<size_t>(probs) * d.m * (d.k / 32));
  p.sb.resize(static_cast<size_t>(probs) * d.n * (d.k / 32));
  for (auto& x : p.sa) x = static_cast<uint8_t>(sc(rng));
  for (auto& x : p.sb) x = static_cast<uint8_t>(sc(rng));
  p.scale_high.resize(kWaveSize);
  for (auto& x : p.scale_high) x = static_cast<uint32_t>(rng());
  p.c.resize(static_cast<size_t>(probs) * d.m * d.n);
  for (auto& x : p.c) x = static_cast<float>(cint(rng));
  return p;
}

// Float64 D = A * B + C (scaled: per-block powers of two) and the sum of
// magnitudes (the summation error's scale).
void Reference(Inst inst, const Problem& p, int prob, mfma::Fp8Kind kind, std::vector<double>* d,
               std::vector<double>* mag) {
  const Dims dm = DimsOf(inst);
  const int blocks = dm.k / 32;
  d->assign(static_cast<size_t>(dm.m) * dm.n, 0);
  mag->assign(d->size(), 0);
  for (int i = 0; i < dm.m; ++i) {
    for (int j = 0; j < dm.n; ++j) {
      double s = p.c[(static_cast<size_t>(prob) * dm.m + i) * dm.n + j], g = std::fabs(s);
      for (int k = 0; k < dm.k; ++k) {
        const uint8_t ca = p.a[(static_cast<size_t>(prob) * dm.m + i) * dm.k + k];
        const uint8_t cb = p.b[(static_cast<size_t>(prob) * dm.k + k) * dm.n + j];
        double x;
        if (Scaled(inst)) {
          const int ea = p.sa[(static_cast<size_t>(prob) * dm.m + i) * blocks + k / 32];
          const int eb = p.sb[(static_cast<size_t>(prob) * dm.n + j) * blocks + k / 32];
          x = (ea == 255 || eb == 255) ? NAN
                                       : std::ldexp(static_cast<double>(mfma::DecodeFp4Operand(ca)) *
                                                        mfma::DecodeFp4Operand(cb),
                                                    ea + eb - 254);
        } else {
          x = DecodeFp8(ca, kind) * DecodeFp8(cb, kind);
        }
        s += x;
        g += std::fabs(x);
      }
      (*d)[i * dm.n + j] = s;
      (*mag)[i * dm.n + j] = g;
    }
  }
}

template <Inst kInst, mfma::Fp8Kind kKind>
std::vector<float> RunOnDevice(const Problem& p, int probs) {
  const Dims d = DimsOf(kInst);
  auto up = [](const void* h, size_t n) {
    void* dptr = nullptr;
    EXPECT_EQ(Malloc(&dptr, std::max<size_t>(n, 4)), kSuccess);
    EXPECT_EQ(CopyH2D(dptr, h, n, nullptr), kSuccess);
    return dptr;
  };
  void* a = up(p.a.data(), p.a.size());
  void* b = up(p.b.data(), p.b.size());
  void* sa = up(p.sa.data(), p.sa.size());
  void* sb = up(p.sb.data(), p.sb.size());
  void* hi = up(p.scale_high.data(), p.scale_high.size() * 4);
  void* c = up(p.c.data(), p.c.size() * 4);
  void* out = nullptr;
  EXPECT_EQ(Malloc(&out, p.c.size() * 4), kSuccess);
  MfmaKernel<kInst, kKind><<<probs / kWavesPerBlock, kWavesPerBlock * kWaveSize>>>(
      static_cast<const uint8_t*>(a), static_cast<const uint8_t*>(b), static_cast<const uint8_t*>(sa),
      static_cast<const uint8_t*>(sb), static_cast<const uint32_t*>(hi), static_cast<const float*>(c),
      static_cast<float*>(out));
  EXPECT_EQ(GetLastError(), kSuccess);
  std::vector<float> got(static_cast<size_t>(probs) * d.m * d.n);
  EXPECT_EQ(CopyD2H(got.data(), out, got.size() * 4, nullptr), kSuccess);
  EXPECT_EQ(StreamSynchronize(nullptr), kSuccess);
  for (void* x : {a, b, sa, sb, hi, c, out}) (void)Free(x);
  return got;
}

// Whether this device runs `inst` with `kind` operands (HIP: its own
// instructions only; CUDA: the model runs everything).
bool DeviceHas(Inst inst, mfma::Fp8Kind kind) {
  if (!kRuntimeIsHip) return true;
  DeviceProp prop;
  if (GetDeviceProperties(&prop, 0) != kSuccess || prop.major != 9) return false;
  if (prop.minor == 4) return !Scaled(inst) && kind == mfma::Fp8Kind::kFnuz;
  return prop.minor == 5 && (Scaled(inst) || kind == mfma::Fp8Kind::kFn);
}

template <Inst kInst, mfma::Fp8Kind kKind>
void Check(bool exact, bool nan_scale) {
  if (GpuDeviceCount() == 0) GTEST_SKIP() << "no GPU: GpuDeviceCount() == 0 on this machine";
  if (!DeviceHas(kInst, kKind)) GTEST_SKIP() << "this device lacks the instruction or operand type";
  const Dims d = DimsOf(kInst);
  const int probs = 8;
  std::mt19937 rng(17 + static_cast<int>(kInst) * 5 + static_cast<int>(kKind) * 3 + exact);
  Problem p = MakeProblem(kInst, probs, exact, kKind, rng);
  if (nan_scale) {  // problem 3: A row 5's block 1, B column 7's block 0
    p.sa[(3 * d.m + 5) * (d.k / 32) + 1] = 255;
    p.sb[(3 * d.n + 7) * (d.k / 32) + 0] = 255;
  }
  const std::vector<float> got = RunOnDevice<kInst, kKind>(p, probs);
  std::vector<double> ref, mag;
  int64_t bad = 0;
  for (int q = 0; q < probs; ++q) {
    Reference(kInst, p, q, kKind, &ref, &mag);
    for (int i = 0; i < d.m; ++i) {
      for (int j = 0; j < d.n; ++j) {
        const float g = got[(static_cast<size_t>(q) * d.m + i) * d.n + j];
        const double r = ref[i * d.n + j];
        bool ok;
        if (std::isnan(r)) {
          ok = std::isnan(g);
        } else if (exact) {
          ok = g == static_cast<float>(r) && static_cast<double>(static_cast<float>(r)) == r;
        } else {
          // K fp32 roundings of partial sums bounded by the magnitude sum.
          ok = std::fabs(g - r) <= (d.k + 2) * std::ldexp(mag[i * d.n + j], -24);
        }
        if (!ok && ++bad <= 5) {
          ADD_FAILURE() << "problem " << q << " D[" << i << "][" << j << "]: got " << g << " want " << r
                        << " (magnitude " << mag[i * d.n + j] << ")";
        }
      }
    }
  }
  EXPECT_EQ(bad, 0);
  if (nan_scale) {
    // The poisoned row and column are NaN, nothing else of problem 3 is.
    int64_t nans = 0;
    for (int i = 0; i < d.m * d.n; ++i) nans += std::isnan(got[3 * d.m * d.n + i]);
    EXPECT_EQ(nans, d.m + d.n - 1);
  }
}

using K = mfma::Fp8Kind;
TEST(MfmaModelTest, Fp8x32x32x16FnuzExact) { Check<Inst::k32x32x16, K::kFnuz>(true, false); }
TEST(MfmaModelTest, Fp8x32x32x16FnuzFullRange) { Check<Inst::k32x32x16, K::kFnuz>(false, false); }
TEST(MfmaModelTest, Fp8x32x32x16FnExact) { Check<Inst::k32x32x16, K::kFn>(true, false); }
TEST(MfmaModelTest, Fp8x32x32x16FnFullRange) { Check<Inst::k32x32x16, K::kFn>(false, false); }
TEST(MfmaModelTest, Fp8x16x16x32FnuzExact) { Check<Inst::k16x16x32, K::kFnuz>(true, false); }
TEST(MfmaModelTest, Fp8x16x16x32FnuzFullRange) { Check<Inst::k16x16x32, K::kFnuz>(false, false); }
TEST(MfmaModelTest, Fp8x16x16x32FnExact) { Check<Inst::k16x16x32, K::kFn>(true, false); }
TEST(MfmaModelTest, Fp8x16x16x32FnFullRange) { Check<Inst::k16x16x32, K::kFn>(false, false); }
TEST(MfmaModelTest, ScaleFp4x32x32x64Exact) { Check<Inst::kScale32x32x64, K::kFn>(true, false); }
TEST(MfmaModelTest, ScaleFp4x32x32x64WideScales) { Check<Inst::kScale32x32x64, K::kFn>(false, false); }
TEST(MfmaModelTest, ScaleFp4x32x32x64NanScale) { Check<Inst::kScale32x32x64, K::kFn>(true, true); }
TEST(MfmaModelTest, ScaleFp4x16x16x128Exact) { Check<Inst::kScale16x16x128, K::kFn>(true, false); }
TEST(MfmaModelTest, ScaleFp4x16x16x128WideScales) { Check<Inst::kScale16x16x128, K::kFn>(false, false); }
TEST(MfmaModelTest, ScaleFp4x16x16x128NanScale) { Check<Inst::kScale16x16x128, K::kFn>(true, true); }

TEST(MfmaModelTest, WaveShflXorEveryMask) {
  if (GpuDeviceCount() == 0) GTEST_SKIP() << "no GPU: GpuDeviceCount() == 0 on this machine";
  const int blocks = 3, waves = blocks * kWavesPerBlock;
  void* out = nullptr;
  ASSERT_EQ(Malloc(&out, static_cast<size_t>(waves) * 6 * kWaveSize * 4), kSuccess);
  ShflKernel<<<blocks, kWavesPerBlock * kWaveSize>>>(static_cast<float*>(out));
  ASSERT_EQ(GetLastError(), kSuccess);
  std::vector<float> got(static_cast<size_t>(waves) * 6 * kWaveSize);
  ASSERT_EQ(CopyD2H(got.data(), out, got.size() * 4, nullptr), kSuccess);
  ASSERT_EQ(StreamSynchronize(nullptr), kSuccess);
  (void)Free(out);
  for (int w = 0; w < waves; ++w) {
    for (int bit = 0; bit < 6; ++bit) {
      for (int lane = 0; lane < kWaveSize; ++lane) {
        ASSERT_EQ(got[(static_cast<size_t>(w) * 6 + bit) * kWaveSize + lane], 1000.f * w + (lane ^ (1 << bit)))
            << "wave " << w << " mask " << (1 << bit) << " lane " << lane;
      }
    }
  }
}

}  // namespace
}  // namespace gpu
}  // namespace indexer

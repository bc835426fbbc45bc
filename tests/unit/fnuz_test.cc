// e4m3fnuz (SPEC §3: bias 8, max 240, one NaN 0x80, no negative zero): the
// worked vectors of tests/data/vectors/e4m3fnuz.txt bit for bit, every code
// against an independent formula, the quantization rules with FP8_MAX = 240
// and the conversions between e4m3fn and e4m3fnuz codes.
#include <cmath>
#include <cstdint>
#include <fstream>
#include <limits>
#include <sstream>
#include <string>
#include <utility>
#include <vector>

#include "gtest/gtest.h"
#include "kernels/format/fp8.h"
#include "kernels/format/numeric.h"

namespace indexer {
namespace {

constexpr Fp8Variant kFn = Fp8Variant::kE4m3fn;
constexpr Fp8Variant kFnuz = Fp8Variant::kE4m3fnuz;

float F(uint32_t bits) { return BitsToFloat(bits); }

// Value of an fnuz code from its definition (not the codec's bit tricks).
double FnuzValue(int code) {
  const int s = code >> 7, e = (code >> 3) & 15, m = code & 7;
  const double mag = e == 0 ? std::ldexp(m, -10) : std::ldexp(1.0 + m / 8.0, e - 8);
  return s ? -mag : mag;
}

TEST(E4m3fnuzTest, WorkedVectorsBitForBit) {
  const std::string path = std::string(INDEXER_VECTORS_DIR) + "/e4m3fnuz.txt";
  std::ifstream in(path);
  ASSERT_TRUE(in.good()) << "cannot open " << path;
  std::string line;
  int n = 0;
  while (std::getline(in, line)) {
    if (line.empty() || line[0] == '#') continue;
    std::istringstream words(line);
    std::string x, code;
    ASSERT_TRUE(words >> x >> code) << line;
    const uint32_t bits = static_cast<uint32_t>(std::stoul(x, nullptr, 16));
    const uint32_t want = static_cast<uint32_t>(std::stoul(code, nullptr, 16));
    EXPECT_EQ(EncodeE4m3fnuz(F(bits)), want) << "input " << x;
    EXPECT_EQ(EncodeFp8(kFnuz, F(bits)), want) << "input " << x;
    ++n;
  }
  EXPECT_EQ(n, 155);
}

TEST(E4m3fnuzTest, DecodeEveryCodeMatchesDefinition) {
  EXPECT_TRUE(std::isnan(DecodeE4m3fnuz(0x80)));
  EXPECT_TRUE(IsFp8Nan(kFnuz, 0x80));
  for (int c = 0; c < 256; ++c) {
    if (c == 0x80) continue;
    EXPECT_FALSE(IsFp8Nan(kFnuz, static_cast<uint8_t>(c))) << c;
    const float v = DecodeE4m3fnuz(static_cast<uint8_t>(c));
    EXPECT_EQ(static_cast<double>(v), FnuzValue(c)) << "code " << c;
    EXPECT_EQ(DecodeFp8(kFnuz, static_cast<uint8_t>(c)), v);
    // Every finite code round-trips (0x00 is the only zero).
    EXPECT_EQ(EncodeE4m3fnuz(v), c) << "code " << c;
  }
  EXPECT_EQ(DecodeE4m3fnuz(0x7f), 240.0f);
  EXPECT_EQ(DecodeE4m3fnuz(0xff), -240.0f);
  EXPECT_EQ(DecodeE4m3fnuz(0x01), 0x1p-10f);
  EXPECT_EQ(DecodeE4m3fnuz(0x08), 0x1p-7f);
  EXPECT_EQ(DecodeE4m3fnuz(0x40), 1.0f);
}

TEST(E4m3fnuzTest, NoNegativeZeroAndSaturation) {
  EXPECT_EQ(EncodeE4m3fnuz(-0.0f), 0x00);
  EXPECT_EQ(EncodeE4m3fnuz(-0x1p-11f), 0x00);  // tie to even: zero, unsigned
  EXPECT_EQ(EncodeE4m3fnuz(-0x1.8p-11f), 0x81);
  EXPECT_EQ(EncodeE4m3fnuz(-1e-30f), 0x00);
  EXPECT_EQ(EncodeE4m3fnuz(240.0f), 0x7f);
  EXPECT_EQ(EncodeE4m3fnuz(247.99f), 0x7f);
  EXPECT_EQ(EncodeE4m3fnuz(448.0f), 0x7f);
  EXPECT_EQ(EncodeE4m3fnuz(-1e30f), 0xff);
  EXPECT_EQ(EncodeE4m3fnuz(std::numeric_limits<float>::infinity()), 0x7f);
  EXPECT_EQ(EncodeE4m3fnuz(-std::numeric_limits<float>::infinity()), 0xff);
  // 232 lies halfway between 224 (0x7e) and 240 (0x7f): to even.
  EXPECT_EQ(EncodeE4m3fnuz(232.0f), 0x7e);
  EXPECT_EQ(EncodeE4m3fnuz(232.01f), 0x7f);
}

TEST(E4m3fnuzTest, KScaleUsesMax240) {
  EXPECT_EQ(Fp8Max(kFnuz), 240.0f);
  EXPECT_EQ(Fp8Max(kFn), 448.0f);
  for (float a : {1e-6f, 1e-4f, 0.3f, 1.0f, 1.875f, 1.876f, 240.0f, 241.0f, 3.7e5f}) {
    const float s = Fp8KScale(a, true, kFnuz);
    const float eff = a > 1e-4f ? a : 1e-4f;
    // s is a power of two, eff <= 240 s, and eff > 240 s / 2.
    EXPECT_EQ(FloatToBits(s) & 0x7fffffu, 0u) << a;
    EXPECT_LE(static_cast<double>(eff), 240.0 * s) << a;
    EXPECT_GT(static_cast<double>(eff), 120.0 * s) << a;
    EXPECT_EQ(Fp8KScale(a, false, kFnuz), eff / 240.0f) << a;
  }
  EXPECT_EQ(Fp8KScale(1.875f, true, kFnuz), 0x1p-7f);  // 1.875 = 240 * 2^-7 exactly
  EXPECT_EQ(Fp8KScale(1.876f, true, kFnuz), 0x1p-6f);
}

TEST(E4m3fnuzTest, QuantizeEntryAndQ) {
  std::vector<float> x(128);
  for (int i = 0; i < 128; ++i) x[i] = std::sin(0.37f * i) * 3.0f;
  x[17] = -9.0f;  // the amax
  std::vector<uint8_t> codes(128);
  for (bool ue8m0 : {false, true}) {
    const float s = QuantizeFp8Entry(x.data(), 128, ue8m0, codes.data(), kFnuz);
    EXPECT_EQ(s, Fp8KScale(std::fabs(x[17]), ue8m0, kFnuz));
    for (int i = 0; i < 128; ++i) {
      EXPECT_EQ(codes[i], EncodeE4m3fnuz(x[i] / s)) << i;
      EXPECT_NE(codes[i], 0x80) << i;
    }
    if (!ue8m0) EXPECT_EQ(codes[17] & 0x7f, 0x7f);  // the amax lands on 240
  }
  const float sq = QuantizeFp8Q(x.data(), 128, codes.data(), kFnuz);
  EXPECT_EQ(sq, Fp8KScale(std::fabs(x[17]), true, kFnuz));
  for (int i = 0; i < 128; ++i) EXPECT_EQ(codes[i], EncodeE4m3fnuz(x[i] / sq)) << i;
}

TEST(Fp8ConversionTest, FnToFnuzIsExactWithTheScaleDoubled) {
  EXPECT_EQ(Fp8ConversionScale(kFn, kFnuz), 2.0f);
  for (int c = 0; c < 256; ++c) {
    if (IsFp8Nan(kFn, static_cast<uint8_t>(c))) continue;
    const uint8_t u = ConvertFp8Code(kFn, kFnuz, static_cast<uint8_t>(c));
    ASSERT_NE(u, 0x80) << "fn code " << c << " became the fnuz NaN";
    EXPECT_EQ(DecodeE4m3fnuz(u) * 2.0f, DecodeE4m3(static_cast<uint8_t>(c))) << "fn code " << c;
  }
  EXPECT_EQ(ConvertFp8Code(kFn, kFnuz, 0x80), 0x00);  // fn -0: fnuz has one zero
  EXPECT_EQ(ConvertFp8Code(kFn, kFnuz, 0x7e), 0x7e);  // 448 = 2 * 224
  EXPECT_EQ(ConvertFp8Code(kFn, kFnuz, 0x01), 0x01);  // 2^-9 = 2 * 2^-10
}

TEST(Fp8ConversionTest, FnuzToFnKeepsTheScaleAndRoundsToNearestEven) {
  EXPECT_EQ(Fp8ConversionScale(kFnuz, kFn), 1.0f);
  for (int c = 0; c < 256; ++c) {
    if (c == 0x80) continue;
    const float v = DecodeE4m3fnuz(static_cast<uint8_t>(c));
    const uint8_t f = ConvertFp8Code(kFnuz, kFn, static_cast<uint8_t>(c));
    ASSERT_FALSE(IsFp8Nan(kFn, f)) << "fnuz code " << c;
    EXPECT_EQ(f, EncodeE4m3(v)) << "fnuz code " << c;
    if (std::fabs(v) >= 0x1p-6f || v == 0.0f) {
      EXPECT_EQ(DecodeE4m3(f), v) << "fnuz code " << c;  // exact above fn's subnormals
    } else {
      EXPECT_LE(std::fabs(DecodeE4m3(f) - v), 0x1p-10f) << "fnuz code " << c;
    }
  }
  EXPECT_EQ(ConvertFp8Code(kFnuz, kFn, 0x7f), 0x77);  // 240 fits e4m3fn
  EXPECT_EQ(ConvertFp8Code(kFnuz, kFn, 0xff), 0xf7);
  EXPECT_EQ(ConvertFp8Code(kFnuz, kFn, 0x01), 0x00);  // 2^-10: tie to even (0)
  EXPECT_EQ(ConvertFp8Code(kFnuz, kFn, 0x81), 0x80);  // -2^-10: fn keeps the sign
  EXPECT_EQ(ConvertFp8Code(kFnuz, kFn, 0x03), 0x02);  // 3 * 2^-10: tie up to 2 * 2^-9
  EXPECT_EQ(ConvertFp8Code(kFn, kFn, 0x80), 0x80);    // same variant: unchanged
}

}  // namespace
}  // namespace indexer

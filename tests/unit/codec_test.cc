// Bit-exact tests of the FP8 / MXFP4 codecs (SPEC §3) against the worked
// vectors in tests/data/vectors and hand-picked corner cases.
#include <cmath>
#include <cstdint>
#include <fstream>
#include <sstream>
#include <string>
#include <vector>

#include "gtest/gtest.h"
#include "kernels/format/fp8.h"
#include "kernels/format/mxfp4.h"
#include "kernels/format/numeric.h"

namespace indexer {
namespace {

std::string VectorPath(const std::string& name) {
  return std::string(INDEXER_VECTORS_DIR) + "/" + name;
}

// The '|'-separated fields of each data line, each a list of hex words.
std::vector<std::vector<std::vector<uint32_t>>> ReadVectors(
    const std::string& name) {
  std::ifstream in(VectorPath(name));
  EXPECT_TRUE(in.good()) << "cannot open " << VectorPath(name);
  std::vector<std::vector<std::vector<uint32_t>>> lines;
  std::string line;
  while (std::getline(in, line)) {
    if (line.empty() || line[0] == '#') continue;
    std::vector<std::vector<uint32_t>> fields(1);
    std::istringstream words(line);
    std::string w;
    while (words >> w) {
      if (w == "|") {
        fields.emplace_back();
      } else {
        fields.back().push_back(
            static_cast<uint32_t>(std::stoul(w, nullptr, 16)));
      }
    }
    lines.push_back(std::move(fields));
  }
  return lines;
}

float F(uint32_t bits) { return BitsToFloat(bits); }

TEST(E4m3Test, Vectors) {
  const auto lines = ReadVectors("e4m3.txt");
  ASSERT_GT(lines.size(), 100u);
  for (const auto& l : lines) {
    ASSERT_EQ(l.size(), 1u);
    ASSERT_EQ(l[0].size(), 2u);
    EXPECT_EQ(EncodeE4m3(F(l[0][0])), l[0][1])
        << std::hex << "input " << l[0][0];
  }
}

TEST(E4m3Test, CornerCases) {
  EXPECT_EQ(EncodeE4m3(0.0f), 0x00);
  EXPECT_EQ(EncodeE4m3(-0.0f), 0x80);
  EXPECT_EQ(EncodeE4m3(-1e-30f), 0x80);    // rounds to zero, keeps its sign
  EXPECT_EQ(EncodeE4m3(F(0x00000001)), 0x00);  // fp32 subnormal input
  EXPECT_EQ(EncodeE4m3(F(0x80000001)), 0x80);
  EXPECT_EQ(EncodeE4m3(448.0f), 0x7e);
  EXPECT_EQ(EncodeE4m3(464.0f), 0x7e);  // would round to 480: saturates
  EXPECT_EQ(EncodeE4m3(1e30f), 0x7e);
  EXPECT_EQ(EncodeE4m3(-1e30f), 0xfe);
  EXPECT_EQ(EncodeE4m3(INFINITY), 0x7e);
  EXPECT_EQ(EncodeE4m3(-INFINITY), 0xfe);
  // Subnormals: 2^-9 is the smallest; 2^-10 ties to 0, 1.5 * 2^-10 to 2^-9.
  EXPECT_EQ(EncodeE4m3(std::ldexp(1.0f, -9)), 0x01);
  EXPECT_EQ(EncodeE4m3(std::ldexp(1.0f, -10)), 0x00);
  EXPECT_EQ(EncodeE4m3(std::ldexp(1.5f, -10)), 0x01);
  EXPECT_EQ(EncodeE4m3(std::ldexp(3.0f, -10)), 0x02);   // 1.5 * 2^-9: tie to even
  EXPECT_EQ(EncodeE4m3(std::ldexp(7.5f, -9)), 0x08);    // carries into normal
  EXPECT_EQ(EncodeE4m3(std::ldexp(1.0f, -6)), 0x08);    // smallest normal
  // Ties to even between normals: 1 + 1/16 lies between 1 and 1.125.
  EXPECT_EQ(EncodeE4m3(1.0625f), 0x38);
  EXPECT_EQ(EncodeE4m3(1.1875f), 0x3a);  // between 1.125 (odd) and 1.25
  EXPECT_EQ(EncodeE4m3(-1.1875f), 0xba);
}

TEST(E4m3Test, DecodeRoundTripsEveryCode) {
  for (int c = 0; c < 256; ++c) {
    const uint8_t code = static_cast<uint8_t>(c);
    const float v = DecodeE4m3(code);
    if ((c & 0x7f) == 0x7f) {
      EXPECT_TRUE(std::isnan(v)) << c;
      continue;
    }
    EXPECT_EQ(EncodeE4m3(v), code) << c;
  }
  EXPECT_EQ(DecodeE4m3(0x7e), 448.0f);
  EXPECT_EQ(DecodeE4m3(0x01), std::ldexp(1.0f, -9));
  EXPECT_TRUE(std::signbit(DecodeE4m3(0x80)));
}

// The value of every e4m3fn code from its bit layout (SPEC §3: sign, 4
// exponent bits with bias 7, 3 mantissa bits; exponent 0 is subnormal,
// 0x7f / 0xff NaN, no infinities), computed as an exact integer mantissa
// times a power of two: a different route from DecodeE4m3's, so a slip in
// either shows up as a mismatch. A wrong decode would skew every FP8 logit
// while the encode round trip above still held if encode shared the slip.
TEST(E4m3Test, DecodeMatchesIndependentTableOnEveryCode) {
  int checked = 0;
  for (int c = 0; c < 256; ++c) {
    const uint8_t code = static_cast<uint8_t>(c);
    const int sign = c >> 7, exp = (c >> 3) & 0xf, man = c & 0x7;
    const float got = DecodeE4m3(code);
    if (exp == 0xf && man == 0x7) {
      EXPECT_TRUE(std::isnan(got)) << "code 0x" << std::hex << c;
      continue;
    }
    // Normal: (8 + m) * 2^(e - 7 - 3); subnormal: m * 2^(1 - 7 - 3).
    const int mantissa = exp == 0 ? man : 8 + man;
    const int power = (exp == 0 ? 1 : exp) - 10;
    double want = std::ldexp(static_cast<double>(mantissa), power);
    if (sign) want = -want;
    EXPECT_EQ(static_cast<double>(got), want) << "code 0x" << std::hex << c;
    EXPECT_EQ(std::signbit(got), sign == 1) << "code 0x" << std::hex << c;
    ++checked;
  }
  EXPECT_EQ(checked, 254);
  // Landmarks written out by hand, so the table's formula is checked too.
  EXPECT_EQ(DecodeE4m3(0x7e), 448.0f);
  EXPECT_EQ(DecodeE4m3(0x08), 0.015625f);   // smallest normal, 2^-6
  EXPECT_EQ(DecodeE4m3(0x07), 0.013671875f);  // largest subnormal, 7 * 2^-9
  EXPECT_EQ(DecodeE4m3(0x38), 1.0f);
  EXPECT_EQ(DecodeE4m3(0xc4), -3.0f);
}

TEST(E2m1Test, Vectors) {
  const auto lines = ReadVectors("e2m1.txt");
  ASSERT_GT(lines.size(), 50u);
  for (const auto& l : lines) {
    ASSERT_EQ(l.size(), 1u);
    ASSERT_EQ(l[0].size(), 2u);
    EXPECT_EQ(EncodeE2m1(F(l[0][0])), l[0][1])
        << std::hex << "input " << l[0][0];
  }
}

TEST(E2m1Test, CornerCases) {
  EXPECT_EQ(EncodeE2m1(0.0f), 0x0);
  EXPECT_EQ(EncodeE2m1(-0.0f), 0x8);
  EXPECT_EQ(EncodeE2m1(-0.1f), 0x8);
  EXPECT_EQ(EncodeE2m1(F(0x80000001)), 0x8);
  EXPECT_EQ(EncodeE2m1(0.25f), 0x0);   // tie to even (0)
  EXPECT_EQ(EncodeE2m1(0.75f), 0x2);   // tie between 0.5 and 1 -> 1 (even)
  EXPECT_EQ(EncodeE2m1(1.25f), 0x2);   // tie between 1 and 1.5 -> 1
  EXPECT_EQ(EncodeE2m1(1.75f), 0x4);   // tie between 1.5 and 2 -> 2
  EXPECT_EQ(EncodeE2m1(2.5f), 0x4);    // tie between 2 and 3 -> 2
  EXPECT_EQ(EncodeE2m1(3.5f), 0x6);    // tie between 3 and 4 -> 4
  EXPECT_EQ(EncodeE2m1(5.0f), 0x6);    // tie between 4 and 6 -> 4
  EXPECT_EQ(EncodeE2m1(5.0001f), 0x7);
  EXPECT_EQ(EncodeE2m1(6.0f), 0x7);
  EXPECT_EQ(EncodeE2m1(1e20f), 0x7);
  EXPECT_EQ(EncodeE2m1(-7.0f), 0xf);
  const float mags[8] = {0, 0.5f, 1, 1.5f, 2, 3, 4, 6};
  for (int c = 0; c < 16; ++c) {
    const float v = DecodeE2m1(static_cast<uint8_t>(c));
    EXPECT_EQ(std::fabs(v), mags[c & 7]) << c;
    EXPECT_EQ(std::signbit(v), (c & 8) != 0) << c;
    EXPECT_EQ(EncodeE2m1(v), c) << c;
  }
}

void CheckFp8EntryFile(const std::string& name, bool ue8m0) {
  const auto lines = ReadVectors(name);
  ASSERT_GT(lines.size(), 10u);
  for (size_t n = 0; n < lines.size(); ++n) {
    const auto& l = lines[n];
    ASSERT_EQ(l.size(), 3u);
    ASSERT_EQ(l[0].size(), 128u);
    ASSERT_EQ(l[1].size(), 1u);
    ASSERT_EQ(l[2].size(), 128u);
    std::vector<float> x(128);
    for (int i = 0; i < 128; ++i) x[i] = F(l[0][i]);
    uint8_t codes[128];
    const float s = QuantizeFp8Entry(x.data(), 128, ue8m0, codes);
    EXPECT_EQ(FloatToBits(s), l[1][0]) << name << " line " << n;
    for (int i = 0; i < 128; ++i) {
      ASSERT_EQ(codes[i], l[2][i]) << name << " line " << n << " element " << i;
    }
  }
}

TEST(Fp8EntryTest, PlainVectors) {
  CheckFp8EntryFile("fp8_k_entries_plain.txt", false);
}
TEST(Fp8EntryTest, Ue8m0Vectors) {
  CheckFp8EntryFile("fp8_k_entries_ue8m0.txt", true);
}

TEST(Fp8ScaleTest, Ue8m0IsSmallestPowerOfTwo) {
  EXPECT_EQ(Fp8KScale(448.0f, true), 1.0f);
  EXPECT_EQ(Fp8KScale(std::nextafter(448.0f, 1e9f), true), 2.0f);
  EXPECT_EQ(Fp8KScale(224.0f, true), 0.5f);
  EXPECT_EQ(Fp8KScale(0.0f, true), Fp8KScale(1e-4f, true));
  for (int e = -13; e < 20; ++e) {  // a >= 1e-4: no floor
    for (float m : {1.0f, 1.25f, 1.75f, 1.7500001f, 1.9999999f}) {
      const float a = std::ldexp(m, e);
      const float s = Fp8KScale(a, true);
      const int k = std::ilogb(s);
      EXPECT_EQ(s, std::ldexp(1.0f, k));
      EXPECT_LE(static_cast<double>(a), 448.0 * s) << a;
      EXPECT_GT(static_cast<double>(a), 448.0 * s / 2) << a;
    }
  }
  EXPECT_EQ(Fp8KScale(1.0f, false), 1.0f / 448.0f);
  EXPECT_EQ(Fp8KScale(0.0f, false), 1e-4f / 448.0f);
}

TEST(Fp8EntryTest, ZerosAndSignedZeros) {
  std::vector<float> x(64, 0.0f);
  x[3] = -0.0f;
  uint8_t codes[64];
  const float s = QuantizeFp8Entry(x.data(), 64, true, codes);
  EXPECT_EQ(s, Fp8KScale(1e-4f, true));
  for (int i = 0; i < 64; ++i) EXPECT_EQ(codes[i], i == 3 ? 0x80 : 0x00);
}

// The Q scale of an all-zero head: 448 * 2^-42 >= 1e-10 > 448 * 2^-43.
const float kQFloorScale = std::ldexp(1.0f, -42);

TEST(Fp8QTest, ScaleIsSmallestPowerOfTwoAndExact) {
  std::vector<float> x(128, 0.0f);
  uint8_t codes[128];
  EXPECT_EQ(QuantizeFp8Q(x.data(), 128, codes), kQFloorScale);
  x[5] = 448.0f;
  x[6] = -3.0f;
  EXPECT_EQ(QuantizeFp8Q(x.data(), 128, codes), 1.0f);
  EXPECT_EQ(codes[5], 0x7e);
  EXPECT_EQ(codes[6], EncodeE4m3(-3.0f));
  x[5] = std::nextafter(448.0f, 1e9f);
  EXPECT_EQ(QuantizeFp8Q(x.data(), 128, codes), 2.0f);
  x[5] = -1000.0f;
  const float s = QuantizeFp8Q(x.data(), 128, codes);
  EXPECT_EQ(s, 4.0f);
  EXPECT_EQ(codes[5], EncodeE4m3(-250.0f));
  // A tiny vector: the floor 1e-10 sets the scale.
  std::fill(x.begin(), x.end(), 1e-20f);
  EXPECT_EQ(QuantizeFp8Q(x.data(), 128, codes), kQFloorScale);
}

TEST(Mxfp4Test, BlockVectors) {
  const auto lines = ReadVectors("mxfp4_blocks.txt");
  ASSERT_GT(lines.size(), 20u);
  for (size_t n = 0; n < lines.size(); ++n) {
    const auto& l = lines[n];
    ASSERT_EQ(l.size(), 2u);
    ASSERT_EQ(l[0].size(), 32u);
    ASSERT_EQ(l[1].size(), 17u);
    float x[32];
    for (int i = 0; i < 32; ++i) x[i] = F(l[0][i]);
    uint8_t packed[16], scale;
    QuantizeMxfp4(x, 32, packed, &scale);
    EXPECT_EQ(scale, l[1][0]) << "line " << n;
    for (int i = 0; i < 16; ++i) {
      EXPECT_EQ(packed[i], l[1][1 + i]) << "line " << n << " byte " << i;
    }
  }
}

TEST(Mxfp4Test, BlockExponent) {
  EXPECT_EQ(MxBlockExponent(0.0f), -126);
  EXPECT_EQ(MxBlockExponent(6.0f), 0);
  EXPECT_EQ(MxBlockExponent(std::nextafter(6.0f, 100.0f)), 1);
  EXPECT_EQ(MxBlockExponent(3.0f), -1);
  EXPECT_EQ(MxBlockExponent(4.0f), 0);
  EXPECT_EQ(MxBlockExponent(3.4e38f), 126);
  for (int e = -120; e <= 120; e += 7) {
    EXPECT_EQ(MxBlockExponent(std::ldexp(6.0f, e)), e);
    EXPECT_EQ(MxBlockExponent(std::ldexp(6.0f, e) * 1.0000001f), e + 1);
  }
}

TEST(Mxfp4Test, AmaxExactlySixTimesPowerOfTwoIsNotClipped) {
  float x[32];
  for (int i = 0; i < 32; ++i) x[i] = (i % 3 - 1) * 0.375f;
  x[7] = -48.0f;  // 6 * 2^3
  uint8_t packed[16], scale;
  QuantizeMxfp4(x, 32, packed, &scale);
  EXPECT_EQ(scale, 127 + 3);
  EXPECT_EQ(Mxfp4Element(packed, &scale, 7), -48.0f);
  EXPECT_EQ((packed[3] >> 4) & 0xf, 0xf);
  // 0.375 / 8 = 0.046875 rounds to 0, with its sign.
  EXPECT_EQ(packed[0] & 0xf, 0x8);
  EXPECT_EQ(packed[0] >> 4, 0x0);
}

TEST(Mxfp4Test, ZerosSignedZerosAndElements) {
  float x[64] = {};
  x[1] = -0.0f;
  x[40] = 3.0f;
  x[41] = -1.5f;
  uint8_t packed[32], scales[2];
  QuantizeMxfp4(x, 64, packed, scales);
  EXPECT_EQ(scales[0], 1);  // e = -126 for an all-zero block
  EXPECT_EQ(packed[0], 0x80);
  EXPECT_EQ(scales[1], 127 - 1);  // 3 <= 6 * 2^-1
  EXPECT_EQ(Mxfp4Element(packed, scales, 40), 3.0f);
  EXPECT_EQ(Mxfp4Element(packed, scales, 41), -1.5f);
  EXPECT_EQ(Mxfp4Element(packed, scales, 42), 0.0f);
}

TEST(Mxfp4Test, SubnormalInputs) {
  float x[32] = {};
  x[0] = F(0x00000001);
  x[1] = F(0x80400000);
  uint8_t packed[16], scale;
  QuantizeMxfp4(x, 32, packed, &scale);
  EXPECT_EQ(scale, 1);
  // 2^-149 * 2^126 = 2^-23 -> 0; -2^-127 * 2^126 = -0.5 -> 0x9.
  EXPECT_EQ(packed[0], 0x90);
}

TEST(NumericTest, Pow2AndCheckFinite) {
  EXPECT_EQ(Pow2(0), 1.0f);
  EXPECT_EQ(Pow2(127), std::ldexp(1.0f, 127));
  EXPECT_EQ(Pow2(-126), std::ldexp(1.0f, -126));
  EXPECT_EQ(Pow2(-149), std::ldexp(1.0f, -149));
  const float ok[3] = {1, -2, 3};
  EXPECT_TRUE(CheckFinite(ok, 3, "k").ok());
  const float bad[3] = {1, NAN, 3};
  const absl::Status s = CheckFinite(bad, 3, "k");
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(s.message().find("k:"), std::string::npos) << s;
  EXPECT_NE(s.message().find("element 1"), std::string::npos) << s;
}

}  // namespace
}  // namespace indexer

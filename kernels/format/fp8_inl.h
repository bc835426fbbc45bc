// Inline definitions of the INDEXER_HD element functions of fp8.h. Included
// by fp8.h only. Everything here compiles under a host compiler, nvcc and
// hip-clang: integer bit manipulation only, no std:: calls, so results are
// exact and identical on every backend.
#pragma once

#include <cstdint>

#include "kernels/format/hd.h"
#include "kernels/format/numeric.h"

namespace indexer {
namespace format_internal {

// Exact 2^e as a float: normal for -126 <= e <= 127, subnormal down to
// 2^-149, 0 below that and +inf above 127.
INDEXER_HD float ExactPow2(int32_t e) {
  if (e > 127) return BitsToFloat(0x7f800000u);
  if (e >= -126) return BitsToFloat(static_cast<uint32_t>(e + 127) << 23);
  if (e >= -149) return BitsToFloat(1u << (e + 149));
  return 0.0f;
}

// Rounds the magnitude bits `mag` of a finite fp32 (sign cleared) to a small
// float format with `man_bits` mantissa bits and exponent bias `bias`, whose
// smallest normal exponent is 1 - bias. Round to nearest even on the
// integer code; the caller handles saturation. Returns the code without sign.
INDEXER_HD uint32_t RoundToSmallFloat(uint32_t mag, int32_t man_bits,
                                      int32_t bias) {
  const int32_t exp = static_cast<int32_t>(mag >> 23) - 127;
  const int32_t drop = 23 - man_bits;  // mantissa bits dropped
  if (exp >= 1 - bias) {
    // Normal in the target: re-bias the exponent field, then drop bits. A
    // carry out of the mantissa bumps the exponent, which is what we want.
    const uint32_t v = mag - (static_cast<uint32_t>(127 - bias) << 23);
    uint32_t r = v >> drop;
    const uint32_t rem = v & ((1u << drop) - 1u);
    const uint32_t half = 1u << (drop - 1);
    if (rem > half || (rem == half && (r & 1u))) ++r;
    return r;
  }
  if (exp == -127) return 0;  // fp32 zero or subnormal: far below any code
  // Subnormal in the target: units of 2^(1 - bias - man_bits).
  const uint32_t m = (mag & 0x7fffffu) | 0x800000u;
  const int32_t shift = drop + (1 - bias) - exp;  // > drop
  if (shift > 24) return 0;  // below half the smallest subnormal
  uint32_t r = m >> shift;
  const uint32_t rem = m & ((1u << shift) - 1u);
  const uint32_t half = 1u << (shift - 1);
  if (rem > half || (rem == half && (r & 1u))) ++r;
  return r;
}

// The smallest power of two s with a <= FP8_MAX * s, computed exactly.
// REQUIRES: a is a positive normal float.
INDEXER_HD float Pow2AtLeastOverMax(float a, Fp8Variant v) {
  const uint32_t bits = FloatToBits(a);
  const int32_t exp = static_cast<int32_t>(bits >> 23) - 127;
  // 448 = 1.75 * 2^8 (mantissa field 0x600000), 240 = 1.875 * 2^7 (0x700000):
  // a = m * 2^exp fits under max * 2^k iff exp < k + E, or exp == k + E and
  // m <= max's mantissa.
  const bool fnuz = v == Fp8Variant::kE4m3fnuz;
  const int32_t e_max = fnuz ? 7 : 8;
  const uint32_t m_max = fnuz ? 0x700000u : 0x600000u;
  const int32_t k = (bits & 0x7fffffu) <= m_max ? exp - e_max : exp - e_max + 1;
  return ExactPow2(k);
}
INDEXER_HD float Pow2AtLeastOver448(float a) {
  return Pow2AtLeastOverMax(a, Fp8Variant::kE4m3fn);
}

}  // namespace format_internal

INDEXER_HD uint8_t EncodeE4m3(float x) {
  const uint32_t bits = FloatToBits(x);
  const uint8_t sign = static_cast<uint8_t>((bits >> 24) & 0x80u);
  const uint32_t mag = bits & 0x7fffffffu;
  if (mag >= 0x43e00000u) return sign | 0x7e;  // |x| >= 448: saturate
  // Below 448 the rounded code is at most 0x7e (448), never the NaN 0x7f.
  return sign | static_cast<uint8_t>(
                    format_internal::RoundToSmallFloat(mag, 3, 7));
}

INDEXER_HD float DecodeE4m3(uint8_t code) {
  const uint32_t sign = static_cast<uint32_t>(code & 0x80u) << 24;
  const uint32_t exp = (code >> 3) & 0xfu;
  const uint32_t man = code & 0x7u;
  if (exp == 0xfu && man == 0x7u) return BitsToFloat(sign | 0x7fc00000u);
  if (exp == 0) {
    // Subnormal: man * 2^-9, exact.
    const float v = static_cast<float>(man) * 0.001953125f;
    return sign ? -v : v;
  }
  return BitsToFloat(sign | ((exp + 120u) << 23) | (man << 20));
}

INDEXER_HD uint8_t EncodeE4m3fnuz(float x) {
  const uint32_t bits = FloatToBits(x);
  const uint32_t mag = bits & 0x7fffffffu;
  if (mag >= 0x43700000u) {  // |x| >= 240: saturate
    return static_cast<uint8_t>(((bits >> 24) & 0x80u) | 0x7fu);
  }
  // Below 240 the rounded code is at most 0x7f (240).
  const uint32_t r = format_internal::RoundToSmallFloat(mag, 3, 8);
  if (r == 0) return 0;  // no negative zero: 0x80 is the NaN
  return static_cast<uint8_t>(((bits >> 24) & 0x80u) | r);
}

INDEXER_HD float DecodeE4m3fnuz(uint8_t code) {
  if (code == 0x80) return BitsToFloat(0x7fc00000u);
  const uint32_t sign = static_cast<uint32_t>(code & 0x80u) << 24;
  const uint32_t exp = (code >> 3) & 0xfu;
  const uint32_t man = code & 0x7u;
  if (exp == 0) {
    // Subnormal: man * 2^-10, exact.
    const float v = static_cast<float>(man) * 0.0009765625f;
    return sign ? -v : v;
  }
  return BitsToFloat(sign | ((exp + 119u) << 23) | (man << 20));
}

INDEXER_HD uint8_t EncodeFp8(Fp8Variant v, float x) {
  return v == Fp8Variant::kE4m3fnuz ? EncodeE4m3fnuz(x) : EncodeE4m3(x);
}
INDEXER_HD float DecodeFp8(Fp8Variant v, uint8_t code) {
  return v == Fp8Variant::kE4m3fnuz ? DecodeE4m3fnuz(code) : DecodeE4m3(code);
}

INDEXER_HD uint8_t ConvertFp8Code(Fp8Variant from, Fp8Variant to, uint8_t c) {
  if (from == to) return c;
  // Halving is exact: fn's smallest subnormal 2^-9 halves to fnuz's 2^-10.
  if (to == Fp8Variant::kE4m3fnuz) return EncodeE4m3fnuz(DecodeE4m3(c) * 0.5f);
  return EncodeE4m3(DecodeE4m3fnuz(c));
}

INDEXER_HD float Fp8KScale(float amax, bool ue8m0, Fp8Variant v) {
  const float a = amax > 1e-4f ? amax : 1e-4f;
  if (ue8m0) return format_internal::Pow2AtLeastOverMax(a, v);
  return a / Fp8Max(v);
}

}  // namespace indexer

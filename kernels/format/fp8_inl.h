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

// The smallest power of two s with a <= 448 * s, computed exactly.
// REQUIRES: a is a positive normal float.
INDEXER_HD float Pow2AtLeastOver448(float a) {
  const uint32_t bits = FloatToBits(a);
  const int32_t exp = static_cast<int32_t>(bits >> 23) - 127;
  // 448 = 1.75 * 2^8, and 1.75 has mantissa field 0x600000: a = m * 2^exp
  // fits under 448 * 2^k iff exp < k + 8, or exp == k + 8 and m <= 1.75.
  const int32_t k = (bits & 0x7fffffu) <= 0x600000u ? exp - 8 : exp - 7;
  return ExactPow2(k);
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

INDEXER_HD float Fp8KScale(float amax, bool ue8m0) {
  const float a = amax > 1e-4f ? amax : 1e-4f;
  if (ue8m0) return format_internal::Pow2AtLeastOver448(a);
  return a / kE4m3Max;
}

}  // namespace indexer

// Inline definitions of the INDEXER_HD element functions of mxfp4.h. Included
// by mxfp4.h only. Integer bit manipulation, no std:: calls: the same exact
// results under a host compiler, nvcc and hip-clang.
#pragma once

#include <cstdint>

#include "kernels/format/fp8.h"  // format_internal helpers
#include "kernels/format/hd.h"
#include "kernels/format/numeric.h"

namespace indexer {

INDEXER_HD uint8_t EncodeE2m1(float x) {
  const uint32_t bits = FloatToBits(x);
  const uint8_t sign = static_cast<uint8_t>((bits >> 28) & 0x8u);
  const uint32_t mag = bits & 0x7fffffffu;
  if (mag >= 0x40c00000u) return sign | 0x7;  // |x| >= 6: saturate
  // e2m1: 1 mantissa bit, exponent bias 1; below 6 the code is at most 7.
  return sign | static_cast<uint8_t>(
                    format_internal::RoundToSmallFloat(mag, 1, 1));
}

INDEXER_HD float DecodeE2m1(uint8_t nib) {
  const uint32_t exp = (nib >> 1) & 0x3u;
  const uint32_t man = nib & 0x1u;
  // exp 0: man * 0.5; else (1 + man / 2) * 2^(exp - 1), built from bits.
  const float mag = exp == 0 ? (man ? 0.5f : 0.0f)
                             : BitsToFloat(((exp + 126u) << 23) | (man << 22));
  return (nib & 0x8u) ? -mag : mag;
}

INDEXER_HD int32_t MxBlockExponent(float amax) {
  // 6 * 2^-126 = 1.5 * 2^-124, a normal float.
  const float floor_v = BitsToFloat(0x01c00000u);
  const float a = amax > floor_v ? amax : floor_v;
  const uint32_t bits = FloatToBits(a);
  const int32_t exp = static_cast<int32_t>(bits >> 23) - 127;
  // 6 = 1.5 * 2^2 and 1.5 has mantissa field 0x400000: m * 2^exp <=
  // 1.5 * 2^(e + 2) iff exp < e + 2, or exp == e + 2 and m <= 1.5.
  int32_t e = (bits & 0x7fffffu) <= 0x400000u ? exp - 2 : exp - 1;
  if (e < -127) e = -127;
  if (e > 127) e = 127;
  return e;
}

INDEXER_HD float Mxfp4Element(const uint8_t* packed, const uint8_t* scales,
                              int i) {
  const uint8_t nib = static_cast<uint8_t>(packed[i >> 1] >> ((i & 1) * 4));
  return DecodeE2m1(nib & 0xfu) *
         format_internal::ExactPow2(
             static_cast<int32_t>(scales[i >> 5]) - 127);  // 32 per scale
}

}  // namespace indexer

// FP8 codecs, e4m3fn (OCP, max 448) and e4m3fnuz (gfx942 hardware: bias 8,
// max 240, one NaN 0x80, no negative zero), and the FP8 quantization rules
// of SPEC §3. Element functions are INDEXER_HD so kernels use the very same
// code.
#pragma once

#include <cstdint>

#include "kernels/format/hd.h"
#include "kernels/format/page_layout.h"

namespace indexer {

inline constexpr float kE4m3Max = 448.0f;
inline constexpr float kE4m3fnuzMax = 240.0f;

// e4m3fn code of `x`: round to nearest even, saturating at +-448, sign kept
// on zero. REQUIRES: x is finite (callers validate inputs first).
INDEXER_HD uint8_t EncodeE4m3(float x);
// Value of an e4m3fn code (0x7f / 0xff are NaN).
INDEXER_HD float DecodeE4m3(uint8_t code);

// e4m3fnuz code of `x`: round to nearest even, saturating at +-240; a value
// that rounds to zero is 0x00 whatever its sign. REQUIRES: x is not NaN.
INDEXER_HD uint8_t EncodeE4m3fnuz(float x);
// Value of an e4m3fnuz code (0x80 is NaN; 0x00 the only zero).
INDEXER_HD float DecodeE4m3fnuz(uint8_t code);

// The variant's largest finite value (FP8_MAX of SPEC §3) and codec.
INDEXER_HD float Fp8Max(Fp8Variant v) {
  return v == Fp8Variant::kE4m3fnuz ? kE4m3fnuzMax : kE4m3Max;
}
INDEXER_HD uint8_t EncodeFp8(Fp8Variant v, float x);
INDEXER_HD float DecodeFp8(Fp8Variant v, uint8_t code);
// True for the variant's NaN codes (fn: 0x7f, 0xff; fnuz: 0x80).
INDEXER_HD bool IsFp8Nan(Fp8Variant v, uint8_t code) {
  return v == Fp8Variant::kE4m3fnuz ? code == 0x80 : (code & 0x7f) == 0x7f;
}

// K entry scale (SPEC §3): a = max(amax, 1e-4); with ue8m0 the smallest power
// of two s with a <= FP8_MAX * s (exact), else a / FP8_MAX (one fp32
// division). FP8_MAX is 448 (fn) or 240 (fnuz).
INDEXER_HD float Fp8KScale(float amax, bool ue8m0,
                           Fp8Variant v = Fp8Variant::kE4m3fn);

// Quantizes one K entry of `d` floats: codes[i] = fp8(x[i] / scale) in the
// variant `v`. REQUIRES: x finite. Returns the scale.
float QuantizeFp8Entry(const float* x, int d, bool ue8m0, uint8_t* codes,
                       Fp8Variant v = Fp8Variant::kE4m3fn);

// Quantizes one (row, head) of Q: s is the smallest power of two with
// s >= max(amax, 1e-10) / FP8_MAX; codes[i] = fp8(x[i] / s). Returns s, which
// the caller multiplies into that head's weight. REQUIRES: x finite.
float QuantizeFp8Q(const float* x, int d, uint8_t* codes,
                   Fp8Variant v = Fp8Variant::kE4m3fn);

// Conversion of codes of one variant into the other (SPEC §3: converted,
// never reinterpreted), keeping the decoded values. Every fn value halved is
// an fnuz value, so fn -> fnuz is exact when the scale doubles:
// ConvertFp8Code(fn, fnuz, c) is the fnuz code of value(c) / 2 (fn -0 becomes
// 0x00) and the caller multiplies the scale (the entry's, or Q's head weight)
// by Fp8ConversionScale, 2. fnuz -> fn keeps the scale (factor 1): the fn
// code of value(c), exact except fnuz values below 2^-6 (fn subnormals step
// 2^-9), rounded to nearest even; fnuz +-240 fit (fn max 448).
// REQUIRES: c is not a NaN code of `from`.
INDEXER_HD uint8_t ConvertFp8Code(Fp8Variant from, Fp8Variant to, uint8_t c);
INDEXER_HD float Fp8ConversionScale(Fp8Variant from, Fp8Variant to) {
  return from == Fp8Variant::kE4m3fn && to == Fp8Variant::kE4m3fnuz ? 2.0f : 1.0f;
}

}  // namespace indexer

#include "kernels/format/fp8_inl.h"

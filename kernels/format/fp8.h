// FP8 e4m3fn (OCP, max 448) codec and the FP8 quantization rules of SPEC §3.
// Element functions are INDEXER_HD so kernels use the very same code.
#pragma once

#include <cstdint>

#include "kernels/format/hd.h"

namespace indexer {

inline constexpr float kE4m3Max = 448.0f;

// e4m3fn code of `x`: round to nearest even, saturating at +-448, sign kept
// on zero. REQUIRES: x is finite (callers validate inputs first).
INDEXER_HD uint8_t EncodeE4m3(float x);
// Value of an e4m3fn code (0x7f / 0xff are NaN).
INDEXER_HD float DecodeE4m3(uint8_t code);

// K entry scale (SPEC §3): a = max(amax, 1e-4); with ue8m0 the smallest power
// of two s with a <= 448 * s (exact), else a / 448 (one fp32 division).
INDEXER_HD float Fp8KScale(float amax, bool ue8m0);

// Quantizes one K entry of `d` floats: codes[i] = e4m3(x[i] / scale).
// REQUIRES: x finite. Returns the scale.
float QuantizeFp8Entry(const float* x, int d, bool ue8m0, uint8_t* codes);

// Quantizes one (row, head) of Q: s is the smallest power of two with
// s >= max(amax, 1e-10) / 448; codes[i] = e4m3(x[i] / s). Returns s, which
// the caller multiplies into that head's weight. REQUIRES: x finite.
float QuantizeFp8Q(const float* x, int d, uint8_t* codes);

}  // namespace indexer

#include "kernels/format/fp8_inl.h"

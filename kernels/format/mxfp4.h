// MXFP4 codec (OCP MX: e2m1 elements, one e8m0 scale per 32) with the
// never-clipping block exponent of SPEC §3. Element functions are INDEXER_HD.
#pragma once

#include <cstdint>

#include "kernels/format/hd.h"

namespace indexer {

// e2m1 nibble of an already-scaled value: magnitudes {0,.5,1,1.5,2,3,4,6},
// round to nearest even, saturating at 6, sign kept on zero (-0 -> 0x8).
// REQUIRES: x finite.
INDEXER_HD uint8_t EncodeE2m1(float x);
// Value of an e2m1 nibble (low 4 bits of `nib`).
INDEXER_HD float DecodeE2m1(uint8_t nib);

// Block exponent: the smallest integer e with max(amax, 6*2^-126) <= 6*2^e,
// clamped to [-127, 127]. The scale byte is e + 127.
INDEXER_HD int32_t MxBlockExponent(float amax);

// Quantizes `d` floats (d % 32 == 0) to d/2 packed bytes (low nibble = even
// element) and d/32 scale bytes. REQUIRES: x finite.
void QuantizeMxfp4(const float* x, int d, uint8_t* packed, uint8_t* scales);

// Dequantized element i of a packed MXFP4 vector.
INDEXER_HD float Mxfp4Element(const uint8_t* packed, const uint8_t* scales,
                              int i);

}  // namespace indexer

#include "kernels/format/mxfp4_inl.h"

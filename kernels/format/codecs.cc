// Host quantizers of whole entries / blocks (SPEC §3), built on the element
// functions that the gpu kernels share.
#include <cstdint>
#include <cstring>

#include "kernels/format/fp8.h"
#include "kernels/format/mxfp4.h"
#include "kernels/format/numeric.h"

namespace indexer {
namespace {

float AbsMax(const float* x, int n) {
  float amax = 0.0f;
  for (int i = 0; i < n; ++i) {
    const float a = BitsToFloat(FloatToBits(x[i]) & 0x7fffffffu);
    amax = a > amax ? a : amax;
  }
  return amax;
}

}  // namespace

float QuantizeFp8Entry(const float* x, int d, bool ue8m0, uint8_t* codes, Fp8Variant v) {
  const float s = Fp8KScale(AbsMax(x, d), ue8m0, v);
  for (int i = 0; i < d; ++i) codes[i] = EncodeFp8(v, x[i] / s);
  return s;
}

float QuantizeFp8Q(const float* x, int d, uint8_t* codes, Fp8Variant v) {
  const float amax = AbsMax(x, d);
  const float s =
      format_internal::Pow2AtLeastOverMax(amax > 1e-10f ? amax : 1e-10f, v);
  for (int i = 0; i < d; ++i) codes[i] = EncodeFp8(v, x[i] / s);
  return s;
}

void QuantizeMxfp4(const float* x, int d, uint8_t* packed, uint8_t* scales) {
  for (int b = 0; b < d / 32; ++b) {
    const float* xb = x + b * 32;
    const int32_t e = MxBlockExponent(AbsMax(xb, 32));
    scales[b] = static_cast<uint8_t>(e + 127);
    const float inv = Pow2(-e);  // exact: -e is within [-127, 127]
    uint8_t* pb = packed + b * 16;
    for (int i = 0; i < 16; ++i) {
      const uint8_t lo = EncodeE2m1(xb[2 * i] * inv);
      const uint8_t hi = EncodeE2m1(xb[2 * i + 1] * inv);
      pb[i] = static_cast<uint8_t>(lo | (hi << 4));
    }
  }
}

}  // namespace indexer

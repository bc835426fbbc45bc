// Small numeric helpers shared by the codecs and the backends.
#pragma once

#include <cstdint>
#include <cstring>

#include "absl/status/status.h"
#include "absl/strings/string_view.h"
#include "kernels/format/hd.h"

namespace indexer {

INDEXER_HD float BitsToFloat(uint32_t u) {
  float f;
  memcpy(&f, &u, sizeof f);
  return f;
}
INDEXER_HD uint32_t FloatToBits(float f) {
  uint32_t u;
  memcpy(&u, &f, sizeof u);
  return u;
}
INDEXER_HD float Bf16ToFloat(uint16_t h) {
  return BitsToFloat(static_cast<uint32_t>(h) << 16);
}
// Exact 2^e for -149 <= e <= 127.
float Pow2(int e);

// INVALID_ARGUMENT naming `field` and the first non-finite element, or OK.
absl::Status CheckFinite(const float* x, int64_t n, absl::string_view field);

}  // namespace indexer

// The top-k's order-preserving key of an fp32 logit and its first radix
// digit, shared by the top-k kernels and the logits kernel that builds the
// cooperative top-k's first histogram in its epilogue (the two must bin
// every logit alike).
#pragma once

#include <cstdint>

#include "kernels/format/numeric.h"
#include "kernels/gpu/gpu_compat.h"

namespace indexer {
namespace gpu {

// Bins of the first radix pass: the key's top 11 bits.
inline constexpr int kTopkBins = 2048;
inline constexpr int kTopBinShift = 21;

// Larger key = larger logit; -0.0 folded onto +0.0. Finite keys are >= 1,
// so key 0 pads candidate lists. (Host too: tests build the histogram the
// logits kernel would.)
INDEXER_HD uint32_t OrderedKey(float f) {
  uint32_t u = FloatToBits(f);
  if (u == 0x80000000u) u = 0;
  return (u & 0x80000000u) ? ~u : (u | 0x80000000u);
}

INDEXER_HD uint32_t TopBin(uint32_t key) { return key >> kTopBinShift; }

}  // namespace gpu
}  // namespace indexer

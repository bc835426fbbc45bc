#include "kernels/cpu/topk.h"

#include <algorithm>
#include <cstring>
#include <functional>
#include <vector>

namespace indexer {
namespace {

// Maps a float to a uint32 whose unsigned order is the float order, with
// -0.0 folded onto +0.0.
inline uint32_t OrderedBits(float f) {
  uint32_t u;
  std::memcpy(&u, &f, sizeof u);
  if (u == 0x80000000u) u = 0;
  return (u & 0x80000000u) ? ~u : (u | 0x80000000u);
}

}  // namespace

void TopkRow(const float* logits, int32_t n, int32_t k, int32_t* out) {
  if (k <= 0) return;
  if (n <= k) {
    for (int32_t i = 0; i < n; ++i) out[i] = i;
    for (int32_t i = std::max<int32_t>(n, 0); i < k; ++i) out[i] = -1;
    return;
  }
  // One 64-bit key per entry: the ordered logit above the complemented
  // position, so a larger key is a larger logit or, on a tie, a smaller
  // position. Keys are distinct, which makes the selection a total order.
  thread_local std::vector<uint64_t> keys;
  keys.resize(static_cast<size_t>(n));
  for (int32_t i = 0; i < n; ++i) {
    keys[i] = (static_cast<uint64_t>(OrderedBits(logits[i])) << 32) |
              (0xffffffffu - static_cast<uint32_t>(i));
  }
  std::nth_element(keys.begin(), keys.begin() + k, keys.end(),
                   std::greater<uint64_t>());
  std::sort(keys.begin(), keys.begin() + k, std::greater<uint64_t>());
  for (int32_t i = 0; i < k; ++i) {
    out[i] = static_cast<int32_t>(0xffffffffu -
                                  static_cast<uint32_t>(keys[i] & 0xffffffffu));
  }
}

}  // namespace indexer

// Exact per-row top-k selection of the cpu backend (SPEC §5).
#pragma once

#include <cstdint>

namespace indexer {

// Writes to out[0, k) the positions of the k largest of logits[0, n).
// Ties are broken by the smaller position, so the result is deterministic;
// -0.0 counts as equal to +0.0. Positions come out in descending logit
// order. When n <= k, out holds 0 .. n-1 and then -1.
// REQUIRES: n >= 0, k >= 0, out has room for k values.
// Thread safety: safe to call concurrently (scratch is thread-local).
void TopkRow(const float* logits, int32_t n, int32_t k, int32_t* out);

}  // namespace indexer

// Needles for the soak's long-context mode (soak_driver --long-tokens): K
// entries whose scores stand out so far that every one a query row sees
// must be in its top-k, whatever the context length. A value check that
// costs a few comparisons per row.
//
// The field: a random unit direction u per head dimension; needle entries
// are 16 u, every other entry one of 4,096 quantized N(0, 1) entries
// (drawn once per layer, placed by a per-sequence salt), and every query
// row is u for every head (weights 1/H). A needle scores 16 * |u|^2 = 16,
// noise N(0, 1): below 6 over a million entries. Needles sit at token
// positions, so at entry t / r of each layer: the same tokens in every
// layer, whence a candidate source's pool takes a needle's block and its
// consumers find the needle too.
//
// Thread safety: a NeedleField is one thread's (it draws lazily).
#pragma once

#include <cstdint>
#include <map>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/types/span.h"
#include "client/reference.h"
#include "client/workload.h"
#include "indexer/v1/indexer.pb.h"

namespace indexer::soak {

inline constexpr float kNeedleNorm = 16.0f;
inline constexpr int64_t kNoiseEntries = 4096;

class NeedleField {
 public:
  explicit NeedleField(uint64_t seed) : rng_(seed) {}

  // The unit direction of head dimension d (random signs / sqrt(d)).
  const std::vector<float>& Direction(int32_t d);
  // FP32 Q [rows, H, D] of `spec`: u in every row and head.
  v1::Tensor Queries(const client::LayerSpec& spec, int64_t rows);
  // Linear wire entries [first, first + n) of `spec` for a sequence with
  // needles at token positions `needles` and noise salt `salt`: the
  // quantized 16 u at entries t / r, else noise. The same arguments give
  // the same bytes (a handover compares an export against them).
  std::vector<uint8_t> Entries(const client::LayerSpec& spec, int64_t first, int64_t n,
                               absl::Span<const int64_t> needles, uint64_t salt);

 private:
  client::Rng rng_;
  std::map<int32_t, std::vector<float>> directions_;
  std::map<uint32_t, std::vector<uint8_t>> noise_, needle_;  // per layer, quantized
};

// Needles per sequence: three, fewer when a layer's top-k has fewer places
// free of forced entries (a block layer's init and local blocks, a pool's
// pinned block; a source's or consumer's pool of candidate blocks).
int NeedlesPerSeq(const std::vector<client::LayerSpec>& specs);

// `count` (<= 3) needle token positions for a context of `len` tokens
// (>= 1024): one in the first eighth, one in the middle third, one in the
// last eighth.
std::vector<int64_t> PlaceNeedles(client::Rng& rng, int64_t len, int count);

// Every needle a row sees is in the row's top-k: for each row of the
// batch (`q_lens`, `needles` and `names` per sequence; `bounds` per row,
// client::ReplyRowBounds), each needle whose entry (block, for a block
// layer) is below the row's bound must be in the row ([rows, topk]; block
// layers [Hi, rows, topk_blocks]: in every head's row). INTERNAL naming
// the layer, row, sequence, head and needle otherwise. Adds the needles
// found to *found.
absl::Status CheckNeedles(const client::LayerSpec& spec, absl::Span<const int64_t> bounds,
                          absl::Span<const int64_t> q_lens,
                          const std::vector<std::vector<int64_t>>& needles,
                          const std::vector<std::string>& names, absl::Span<const int32_t> topk,
                          int64_t* found);

}  // namespace indexer::soak

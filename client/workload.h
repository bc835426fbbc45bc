// Synthetic indexer inputs for demos, benchmarks and tests: a small fast
// random generator and builders of the wire tensors of one layer (K entries,
// index queries, head weights) in the forms LayerRequest accepts (SPEC §3,
// proto LayerRequest).
//
// Thread safety: Rng is a plain value, one per thread; the builders are pure
// functions.
#pragma once

#include <cstdint>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "absl/types/span.h"
#include "client/reference.h"
#include "indexer/v1/indexer.pb.h"

namespace indexer::client {

// xoshiro256** seeded through splitmix64: deterministic for a seed, fast
// enough to fill prefill-sized Q tensors.
class Rng {
 public:
  explicit Rng(uint64_t seed);
  uint64_t Next();
  // Uniform in [0, 1).
  float Uniform();
  // Standard normal (Box-Muller).
  float Normal();
  void FillNormal(absl::Span<float> out);

 private:
  uint64_t s_[4];
  float spare_ = 0;
  bool has_spare_ = false;
};

// [rows, H] positive head weights: uniform in [0.5, 1.5) times the model's
// D^-0.5 * H^-0.5 (SPEC §3; the caller's part of w').
std::vector<float> RandomWeights(Rng& rng, const LayerSpec& spec,
                                 int64_t rows);

// The K tensor of a LayerRequest / LayerEntries: `prequantized` sends the
// linear entries `quantized` as UINT8 [n, VB + SB]; otherwise the fp32
// entries `raw` as FP32 [n, D], which the daemon quantizes with the same
// codecs. REQUIRES: both describe the same n entries.
v1::Tensor MakeKTensor(const LayerSpec& spec, absl::Span<const float> raw,
                       absl::Span<const uint8_t> quantized, bool prequantized);

// Sets q, q_scale and weights of `request`. `q_fp32`: Q as FP32
// [rows, H, D] from `raw_q` with the caller's weights `raw_weights` (the
// daemon quantizes and, for FP8, folds the scales in); otherwise the
// quantized `q`: FP8_E4M3 [rows, H, D] with q.weights, or MXFP4 UINT8
// [rows, H, D/2] plus q_scale [rows, H, D/32].
void SetQueries(const LayerSpec& spec, const QuantizedQ& q,
                absl::Span<const float> raw_q,
                absl::Span<const float> raw_weights, bool q_fp32,
                v1::LayerRequest* request);

// Wire forms of a block layer's Q ([rows, Hi, D], no weights).
enum class BlockQFormat { kFp32, kBf16, kFp8 };
// "fp32", "bf16", "fp8"; INVALID_ARGUMENT for anything else.
absl::StatusOr<BlockQFormat> ParseBlockQFormat(absl::string_view name);
const char* BlockQFormatName(BlockQFormat format);

// Sets q (and for FP8 the [rows, Hi] FP32 q_scale) of a block-layer
// `request` from `raw_q` [rows, Hi, D] and returns the values the daemon
// scores with, [rows, Hi, D]: raw_q itself, rounded to bf16 (nearest even),
// or e4m3 codes (QuantizeFp8Q per (row, head)) decoded times their scale.
// REQUIRES: raw_q.size() == rows * Hi * D, finite.
std::vector<float> SetBlockQueries(const LayerSpec& spec, int32_t rows,
                                   absl::Span<const float> raw_q,
                                   BlockQFormat format,
                                   v1::LayerRequest* request);

// Wire bytes of one layer request of `rows` rows and `new_entries` new
// entries in the given forms (tensor data only; protobuf framing is small).
// Block layers send Q in `block_q` and no weights.
int64_t LayerRequestBytes(const LayerSpec& spec, int64_t rows,
                          int64_t new_entries, bool q_fp32, bool prequantized,
                          BlockQFormat block_q = BlockQFormat::kBf16);
// Bytes of the layer's reply tensor per row.
int64_t ReplyBytesPerRow(const LayerSpec& spec);

// Tokens per WriteEntries message when importing a long sequence: as many
// as fit `budget_bytes` of prequantized K over every layer of `specs` (with
// a byte per token and layer for framing), at least 1 and at most
// `max_q_len` (what the daemon accepts per import). The caller picks the
// budget under the daemon's max_message_bytes.
int64_t ImportChunkTokens(const std::vector<LayerSpec>& specs,
                          int64_t max_q_len, int64_t budget_bytes);

}  // namespace indexer::client

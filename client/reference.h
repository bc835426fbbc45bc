// A plain reference of the indexer paths (SPEC §2, §3, §5): dense, the
// two-level candidate path (source pools, consumers) and the MiniMax block
// path, kept by the client over the K entries it generated itself, and the
// checkers of the top-k correctness rule of SPEC §5. Used by
// `indexer-cli demo` and by tests.
//
// The reference is written for clarity, not speed: it decodes every entry it
// scores and accumulates in double. The client quantizes K with the project's
// codecs (kernels/format) and keeps the linear [VB + SB] form of every entry,
// exactly the bytes the daemon stores whether it received them pre-quantized
// or as fp32 (it quantizes with the same codecs).
//
// Thread safety: ReferenceIndexer is not synchronized; concurrent const calls
// (Logits) are safe, Append must not run concurrently with anything else.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/types/span.h"
#include "indexer/v1/indexer.pb.h"
#include "kernels/format/page_layout.h"
#include "kernels/geometry/step_geometry.h"

namespace indexer::client {

// ------------------------------------------------------------ geometry --

inline constexpr char kRoleDense[] = "dense";
inline constexpr char kRoleSource[] = "candidate_source";
inline constexpr char kRoleConsumer[] = "candidate_consumer";
inline constexpr char kRoleBlock[] = "block";

// One layer as GetServerInfo reports it, joined with its layer group.
struct LayerSpec {
  uint32_t layer = 0;
  std::string group;
  std::string role = kRoleDense;  // one of the kRole* names
  KvFormat format = KvFormat::kFp8;
  int32_t head_dim = 128;         // D
  int32_t page_entries = 64;      // E
  int32_t compress_ratio = 1;     // r
  bool ue8m0 = true;              // FP8 K scale rule
  int32_t num_heads = 64;         // H (Hi for block layers)
  int32_t topk = 2048;            // entries per row; block layers: topk_blocks

  // Candidate roles: the set's source layer (the layer itself for a source),
  // entries per candidate block, blocks per row's pool, newest block pinned.
  uint32_t candidate_source = 0;
  int32_t candidate_block_size = 0;
  int32_t candidate_topk_blocks = 0;
  bool pin_newest_block = true;

  // Block role: blocks (= pages) per (head, row), blocks forced in at the
  // start and at the causal end, the score reduction and q . k's scale.
  int32_t topk_blocks = 0;
  int32_t init_blocks = 0;
  int32_t local_blocks = 0;
  std::string score = "max";
  float scale = 0;

  bool is_source() const { return role == kRoleSource; }
  bool is_consumer() const { return role == kRoleConsumer; }
  bool is_block() const { return role == kRoleBlock; }

  // VB / SB / VB + SB of one linear entry (SPEC §4).
  int32_t value_bytes() const {
    return format == KvFormat::kFp8 ? head_dim : head_dim / 2;
  }
  int32_t scale_bytes() const {
    return format == KvFormat::kFp8 ? 4 : head_dim / kMxBlock;
  }
  int32_t entry_bytes() const { return value_bytes() + scale_bytes(); }
  // Shape of the layer's reply for `rows` rows: [rows, topk], or for block
  // layers [Hi, rows, topk_blocks].
  std::vector<int64_t> ReplyShape(int64_t rows) const;
  // "fp8 (ue8m0) D=128 E=64 r=4 H=64 topk=2048".
  std::string DebugString() const;
  // The role and its parameters, compactly: "dense top 2048",
  // "consumer of 20 (block 8, pool 2048, pinned) top 512",
  // "block top 16 init 0 local 1 score max scale 0.0884".
  std::string RoleString() const;
};

// Every layer of the profile, sorted by layer id. Fails (INVALID_ARGUMENT /
// UNIMPLEMENTED) on what the reference cannot model: an unknown group,
// kv_format or role, D not a multiple of 32, a zero head count, topk or
// candidate / block parameter, a consumer whose source is not a source
// layer listed before it, a block score other than "max".
absl::StatusOr<std::vector<LayerSpec>> LayerSpecsFromInfo(
    const v1::ServerInfo& info);

// Token arithmetic (entries for tokens, new entries of a step, visible
// entries of a row) is kernels/geometry/step_geometry.h: EntriesFor,
// NewEntriesFor, VisibleEntries.

// ---------------------------------------------------------- quantization --

// Quantizes `n` fp32 K entries ([n, D] row-major) into the linear wire form
// [n, VB + SB]: FP8 codes then the fp32 scale (little-endian); MXFP4 packed
// e2m1 then the e8m0 scale bytes. REQUIRES: k.size() == n * D, k finite.
std::vector<uint8_t> QuantizeKEntries(const LayerSpec& spec,
                                      absl::Span<const float> k);

// Index queries of one layer, quantized the way the daemon sees them.
struct QuantizedQ {
  int32_t rows = 0;
  int32_t num_heads = 0;
  std::vector<uint8_t> values;  // [rows, H, VB] e4m3 codes or packed e2m1
  std::vector<uint8_t> scales;  // [rows, H, D/32] e8m0 (MXFP4), else empty
  std::vector<float> weights;   // [rows, H]; FP8: q scales folded in
};

// FP8: each (row, head) through QuantizeFp8Q, its power-of-two scale
// multiplied into the weight (what the daemon does with an FP32 Q, and what
// a caller does before sending FP8_E4M3). MXFP4: QuantizeMxfp4 per
// (row, head), weights unchanged.
// REQUIRES: q.size() == rows * H * D, weights.size() == rows * H, finite.
QuantizedQ QuantizeQ(const LayerSpec& spec, int32_t rows,
                     absl::Span<const float> q, absl::Span<const float> weights);

// ------------------------------------------------------------- reference --

class ReferenceIndexer {
 public:
  // `layers` from LayerSpecsFromInfo; `num_seqs` sequences, numbered 0.. by
  // the caller, each starting empty.
  ReferenceIndexer(std::vector<LayerSpec> layers, int32_t num_seqs);

  const std::vector<LayerSpec>& layers() const { return layers_; }
  // NOT_FOUND for an unknown layer id.
  absl::StatusOr<const LayerSpec*> Find(uint32_t layer) const;

  // Appends linear entries ([n, VB + SB] bytes) of `layer` to sequence `seq`.
  absl::Status Append(uint32_t layer, int32_t seq,
                      absl::Span<const uint8_t> entries);
  // Entries held for (layer, seq); -1 when either is unknown.
  int64_t NumEntries(uint32_t layer, int32_t seq) const;
  // Linear entry `e` of (layer, seq). REQUIRES: e < NumEntries(layer, seq).
  absl::Span<const uint8_t> Entry(uint32_t layer, int32_t seq,
                                  int64_t e) const;

  // Dense logits (SPEC §5) of row `row` of `q` over entries [0, visible) of
  // (layer, seq):
  //   FP8:   kscale[e] * sum_h w'[h] * ReLU(q[h] . k[e])
  //   MXFP4: sum_h w'[h] * ReLU(sum_b 2^(eq_b + ek_b) sum_{i in b} q_i k_i)
  // INVALID_ARGUMENT when `visible` exceeds the entries held or q does not
  // match the layer.
  absl::StatusOr<std::vector<float>> Logits(uint32_t layer, int32_t seq,
                                            const QuantizedQ& q, int32_t row,
                                            int64_t visible) const;

  // Block-path scores (SPEC §5) of head `head` of row `row` of a block layer,
  // one per causal block b < ceil(visible / E):
  //   max over e in b, e < visible of scale * (q[row, head] . k[e])
  // with K decoded (MXFP4 elements times 2^(e8m0 - 127); FP8 codes times the
  // entry scale), then the init / local sentinels of ApplyBlockSentinels.
  // `q` is [rows, Hi, D] fp32, the values the daemon reads (BlockQuery).
  absl::StatusOr<std::vector<float>> BlockScores(uint32_t layer, int32_t seq,
                                                 absl::Span<const float> q,
                                                 int32_t row, int32_t head,
                                                 int64_t visible) const;

 private:
  int LayerIndex(uint32_t layer) const;  // -1 if unknown

  std::vector<LayerSpec> layers_;
  int32_t num_seqs_;
  // [layer index][seq]: linear entries, entry_bytes each.
  std::vector<std::vector<std::vector<uint8_t>>> entries_;
};

// -------------------------------------------------------- candidate pools --

// Candidate block maxima of one row (SPEC §5): m[b] = max of logits[e] over
// e in [b * block_size, (b + 1) * block_size), e < logits.size().
std::vector<float> BlockMaxima(absl::Span<const float> logits,
                               int32_t block_size);

// The row's candidate pool as the daemon builds it: the `topk_blocks` blocks
// with the largest maxima, ties broken by the smaller block id; with
// `pin_newest` the newest block (the last one) always in, replacing the
// weakest; all blocks when there are at most `topk_blocks`. Ascending ids.
std::vector<int32_t> SelectCandidatePool(absl::Span<const float> maxima,
                                         int32_t topk_blocks,
                                         bool pin_newest);

// What a checker can rely on about the daemon's pool of a row whose maxima
// it knows only within `slack` (the daemon's fp32 logits differ from the
// reference's by up to that much): `sure` blocks are in every pool the
// daemon may build, `maybe` blocks sit within 2 * slack of the cut and may
// or may not be. `maybe` is empty (and `sure` is SelectCandidatePool's
// answer) unless the cut is ambiguous. Ascending ids.
struct PoolBounds {
  std::vector<int32_t> sure;
  std::vector<int32_t> maybe;
  bool ambiguous() const { return !maybe.empty(); }
};
PoolBounds BoundCandidatePool(absl::Span<const float> maxima,
                              int32_t topk_blocks, bool pin_newest,
                              double slack);

// ----------------------------------------------------------- block path --

inline constexpr float kInitBlockScore = 1e30f;
inline constexpr float kLocalBlockScore = 1e29f;

// Forces the first `init_blocks` of `scores` (one per causal block) to
// kInitBlockScore and the last `local_blocks` to kLocalBlockScore; init wins
// where both apply.
void ApplyBlockSentinels(int32_t init_blocks, int32_t local_blocks,
                         absl::Span<float> scores);

// Causal blocks of a row seeing `visible` entries: ceil(visible / E).
int64_t CausalBlocks(int64_t visible, int32_t page_entries);

// --------------------------------------------------------------- checker --

// Slack for fp32 summation order: a returned index passes when its score is
// >= kth - (relative * max |logit| + absolute), max over the row's logits.
struct TopkTolerance {
  double relative = 1e-4;
  double absolute = 1e-6;
};

// Verdict on one row; `problem` is empty when it agrees.
struct RowVerdict {
  bool ok = true;
  std::string problem;
};

// Checks one returned row `got` ([topk] int32) against the reference logits
// of its visible entries (`logits`, n_r of them), by SPEC §5: exactly
// min(topk, n_r) valid indices first, then -1; no duplicates; every index in
// [0, n_r); every index scoring >= the reference's topk-th largest score
// minus the tolerance, and every entry scoring above it plus the tolerance
// present (ties at the cut go either way, clear winners may not).
RowVerdict CheckTopkRow(absl::Span<const float> logits,
                        absl::Span<const int32_t> got,
                        const TopkTolerance& tolerance = {});

// The same rule for one (head, row) of a block layer: `scores` from
// BlockScores (sentinels included), `got` [topk_blocks] block ids. The
// tolerance scales with the largest non-sentinel score, so forced blocks
// must be present exactly.
RowVerdict CheckBlockRow(absl::Span<const float> scores,
                         absl::Span<const int32_t> got,
                         const TopkTolerance& tolerance = {});

// The rule restricted to the pool, for one row of a candidate consumer:
// `logits` the consumer's dense reference logits over [0, n_r), `pool` the
// bounds of the row's pool (blocks of `block_size` entries). Exact SPEC §5
// rule when the pool is unambiguous: min(topk, visible pool entries)
// indices, then -1, no duplicates, each in the pool and < n_r, each scoring
// >= the k-th pool score minus the tolerance. With `maybe` blocks the count
// may lie between the sure and the sure + maybe counts, indices may come
// from either, and scores are held to the k-th score of the sure entries
// (never above the daemon pool's k-th), so the check never fails a correct
// answer.
RowVerdict CheckConsumerRow(absl::Span<const float> logits,
                            const PoolBounds& pool, int32_t block_size,
                            absl::Span<const int32_t> got,
                            const TopkTolerance& tolerance = {});

// The shape SPEC §5 gives every row of a layer's reply, checked without
// scores (the soak's check, where no K is kept to score against). `topk`
// is the reply's [planes, rows, k] (planes: a block layer's heads, else 1;
// k = spec.topk). Row r's valid indices come first, then -1; they are
// distinct and in [0, bounds[r]) (its visible entries; a block layer's
// causal blocks); there are min(k, bounds[r]) of them, or for a candidate
// consumer, whose pool may hold fewer, between 1 and that while
// bounds[r] > 0 (its pool holds the newest block). The verdict names the
// first violation's plane, row and slot.
RowVerdict CheckReplyShape(const LayerSpec& spec, absl::Span<const int64_t> bounds,
                           absl::Span<const int32_t> topk);

// The bounds CheckReplyShape takes, row by row: sequence s's rows see
// tokens up to old_tokens[s] + 1 .. old_tokens[s] + q_lens[s].
std::vector<int64_t> ReplyRowBounds(const LayerSpec& spec, absl::Span<const int64_t> old_tokens,
                                    absl::Span<const int64_t> q_lens);

// Slack CheckTopkRow allows for these logits: relative * max |logit| +
// absolute.
double TopkSlack(absl::Span<const float> logits,
                 const TopkTolerance& tolerance = {});

// Running tally of row verdicts, for one layer or a whole run.
class AgreementReport {
 public:
  // Records the verdict of one row; `label` (e.g. "step 2 layer 5 row 17")
  // prefixes the problem, the first `kMaxProblems` of which are kept.
  void Add(const std::string& label, const RowVerdict& verdict);
  void Merge(const AgreementReport& other);

  int64_t rows() const { return rows_; }
  int64_t agreeing() const { return agreeing_; }
  bool full() const { return agreeing_ == rows_; }
  const std::vector<std::string>& problems() const { return problems_; }

  static constexpr int kMaxProblems = 16;

 private:
  int64_t rows_ = 0;
  int64_t agreeing_ = 0;
  std::vector<std::string> problems_;
};

}  // namespace indexer::client

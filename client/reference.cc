#include "client/reference.h"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <functional>
#include <limits>
#include <map>
#include <utility>

#include "absl/strings/str_cat.h"
#include "kernels/format/fp8.h"
#include "kernels/format/mxfp4.h"

namespace indexer::client {

// ------------------------------------------------------------ geometry --

std::string LayerSpec::DebugString() const {
  return absl::StrCat(KvFormatName(format),
                      format == KvFormat::kFp8 && ue8m0 ? " (ue8m0)" : "",
                      " D=", head_dim, " E=", page_entries,
                      " r=", compress_ratio, " H=", num_heads,
                      " topk=", topk);
}

std::vector<int64_t> LayerSpec::ReplyShape(int64_t rows) const {
  if (is_block()) return {num_heads, rows, topk_blocks};
  return {rows, topk};
}

std::string LayerSpec::RoleString() const {
  if (is_block()) {
    return absl::StrCat("block top ", topk_blocks, " init ", init_blocks,
                        " local ", local_blocks, " score ", score, " scale ",
                        absl::SixDigits(scale));
  }
  std::string out;
  if (is_source() || is_consumer()) {
    out = is_source() ? "candidate source"
                      : absl::StrCat("consumer of ", candidate_source);
    absl::StrAppend(&out, " (block ", candidate_block_size, ", pool ",
                    candidate_topk_blocks,
                    pin_newest_block ? ", pinned)" : ", unpinned)");
  } else {
    out = role;
  }
  absl::StrAppend(&out, " top ", topk);
  return out;
}

namespace {

// Reads the role parameters of `l` into `spec` and checks them on their own;
// CheckCandidateSets relates consumers to sources.
absl::Status ReadRole(const v1::LayerInfo& l, LayerSpec& spec) {
  const std::string where = absl::StrCat("server info: layer ", l.layer());
  spec.role = l.role().empty() ? kRoleDense : l.role();
  if (spec.is_block()) {
    spec.topk_blocks = static_cast<int32_t>(l.topk_blocks());
    spec.init_blocks = static_cast<int32_t>(l.init_blocks());
    spec.local_blocks = static_cast<int32_t>(l.local_blocks());
    spec.score = l.score().empty() ? "max" : l.score();
    spec.scale = l.scale() > 0
                     ? l.scale()
                     : 1.0f / std::sqrt(static_cast<float>(spec.head_dim));
    spec.topk = spec.topk_blocks;
    if (spec.topk_blocks <= 0) {
      return absl::InvalidArgumentError(absl::StrCat(
          where, " (block) topk_blocks: expected >= 1, got ", l.topk_blocks()));
    }
    if (spec.score != "max") {
      return absl::UnimplementedError(absl::StrCat(
          where, " (block) score: expected \"max\", got \"", spec.score,
          "\""));
    }
    return absl::OkStatus();
  }
  spec.topk = static_cast<int32_t>(l.topk());
  if (spec.role == kRoleDense) return absl::OkStatus();
  if (!spec.is_source() && !spec.is_consumer()) {
    return absl::UnimplementedError(absl::StrCat(
        where, " role: expected dense, candidate_source, candidate_consumer "
        "or block, got '", spec.role, "'"));
  }
  spec.candidate_source = spec.is_source() ? l.layer() : l.candidate_source();
  spec.candidate_block_size = static_cast<int32_t>(l.candidate_block_size());
  spec.candidate_topk_blocks = static_cast<int32_t>(l.candidate_topk_blocks());
  spec.pin_newest_block = l.pin_newest_block();
  if (spec.candidate_block_size <= 0 || spec.candidate_topk_blocks <= 0) {
    return absl::InvalidArgumentError(absl::StrCat(
        where, " (", spec.role, "): expected candidate_block_size and "
        "candidate_topk_blocks >= 1, got ", l.candidate_block_size(), " and ",
        l.candidate_topk_blocks()));
  }
  return absl::OkStatus();
}

// Every consumer names a source layer listed before it, in its group, with
// the same candidate parameters (the pool is the source's).
absl::Status CheckCandidateSets(const std::vector<LayerSpec>& specs) {
  std::map<uint32_t, const LayerSpec*> sources;
  for (const LayerSpec& s : specs) {
    if (s.is_source()) sources[s.layer] = &s;
    if (!s.is_consumer()) continue;
    auto it = sources.find(s.candidate_source);
    const LayerSpec* src = it == sources.end() ? nullptr : it->second;
    if (src == nullptr || src->group != s.group ||
        src->candidate_block_size != s.candidate_block_size ||
        src->candidate_topk_blocks != s.candidate_topk_blocks ||
        src->pin_newest_block != s.pin_newest_block) {
      return absl::InvalidArgumentError(absl::StrCat(
          "server info: layer ", s.layer, " (candidate_consumer) "
          "candidate_source: expected an earlier candidate_source layer of "
          "group '", s.group, "' with the same block size, pool size and "
          "pinning, got layer ", s.candidate_source));
    }
  }
  return absl::OkStatus();
}

}  // namespace

absl::StatusOr<std::vector<LayerSpec>> LayerSpecsFromInfo(
    const v1::ServerInfo& info) {
  std::map<std::string, const v1::LayerGroupInfo*> groups;
  for (const v1::LayerGroupInfo& g : info.groups()) groups[g.name()] = &g;

  std::vector<LayerSpec> specs;
  for (const v1::LayerInfo& l : info.layers()) {
    auto it = groups.find(l.group());
    if (it == groups.end()) {
      return absl::InvalidArgumentError(absl::StrCat(
          "server info: layer ", l.layer(), " names unknown group '",
          l.group(), "'"));
    }
    const v1::LayerGroupInfo& g = *it->second;
    LayerSpec spec;
    spec.layer = l.layer();
    spec.group = g.name();
    if (g.kv_format() == "fp8") {
      spec.format = KvFormat::kFp8;
    } else if (g.kv_format() == "mxfp4") {
      spec.format = KvFormat::kMxfp4;
    } else {
      return absl::UnimplementedError(absl::StrCat(
          "server info: group '", g.name(), "' kv_format: expected fp8 or "
          "mxfp4, got '", g.kv_format(), "'"));
    }
    spec.head_dim = static_cast<int32_t>(g.head_dim());
    spec.page_entries = static_cast<int32_t>(g.page_entries());
    spec.compress_ratio = std::max<int32_t>(1, g.compress_ratio());
    spec.ue8m0 = g.ue8m0();
    spec.num_heads = static_cast<int32_t>(l.num_heads());
    if (spec.head_dim <= 0 || spec.head_dim % kMxBlock != 0) {
      return absl::InvalidArgumentError(absl::StrCat(
          "server info: group '", g.name(), "' head_dim: expected a positive "
          "multiple of 32, got ", g.head_dim()));
    }
    if (absl::Status role = ReadRole(l, spec); !role.ok()) return role;
    if (spec.num_heads <= 0 || spec.topk <= 0) {
      return absl::InvalidArgumentError(absl::StrCat(
          "server info: layer ", l.layer(), ": expected num_heads and topk "
          ">= 1, got ", l.num_heads(), " and ", l.topk()));
    }
    if (g.entry_bytes() != 0 &&
        g.entry_bytes() != static_cast<uint32_t>(spec.entry_bytes())) {
      return absl::InvalidArgumentError(absl::StrCat(
          "server info: group '", g.name(), "' entry_bytes: expected ",
          spec.entry_bytes(), " for ", g.kv_format(), " D=", g.head_dim(),
          ", got ", g.entry_bytes()));
    }
    specs.push_back(std::move(spec));
  }
  std::sort(specs.begin(), specs.end(),
            [](const LayerSpec& a, const LayerSpec& b) {
              return a.layer < b.layer;
            });
  for (size_t i = 1; i < specs.size(); ++i) {
    if (specs[i].layer == specs[i - 1].layer) {
      return absl::InvalidArgumentError(absl::StrCat(
          "server info: layer ", specs[i].layer, " is listed twice"));
    }
  }
  if (absl::Status sets = CheckCandidateSets(specs); !sets.ok()) return sets;
  return specs;
}

// ---------------------------------------------------------- quantization --

std::vector<uint8_t> QuantizeKEntries(const LayerSpec& spec,
                                      absl::Span<const float> k) {
  const int32_t d = spec.head_dim;
  const int64_t n = static_cast<int64_t>(k.size()) / d;
  const int32_t eb = spec.entry_bytes();
  std::vector<uint8_t> out(static_cast<size_t>(n) * eb);
  for (int64_t e = 0; e < n; ++e) {
    const float* x = k.data() + e * d;
    uint8_t* entry = out.data() + e * eb;
    if (spec.format == KvFormat::kFp8) {
      const float scale = QuantizeFp8Entry(x, d, spec.ue8m0, entry);
      std::memcpy(entry + d, &scale, sizeof scale);
    } else {
      QuantizeMxfp4(x, d, entry, entry + d / 2);
    }
  }
  return out;
}

QuantizedQ QuantizeQ(const LayerSpec& spec, int32_t rows,
                     absl::Span<const float> q,
                     absl::Span<const float> weights) {
  const int32_t d = spec.head_dim;
  const int32_t h = spec.num_heads;
  const int64_t heads = static_cast<int64_t>(rows) * h;
  QuantizedQ out;
  out.rows = rows;
  out.num_heads = h;
  out.values.resize(static_cast<size_t>(heads) * spec.value_bytes());
  out.weights.assign(weights.begin(), weights.end());
  if (spec.format == KvFormat::kMxfp4) {
    out.scales.resize(static_cast<size_t>(heads) * (d / kMxBlock));
  }
  for (int64_t rh = 0; rh < heads; ++rh) {
    const float* x = q.data() + rh * d;
    if (spec.format == KvFormat::kFp8) {
      out.weights[rh] *= QuantizeFp8Q(x, d, out.values.data() + rh * d);
    } else {
      QuantizeMxfp4(x, d, out.values.data() + rh * (d / 2),
                    out.scales.data() + rh * (d / kMxBlock));
    }
  }
  return out;
}

// ------------------------------------------------------------- reference --

namespace {

// Decodes one linear entry, or one (row, head) of Q, to `d` floats; returns
// the FP8 K scale (1 for MXFP4, whose block scales are applied per element:
// 2^(eq + ek) q_i k_i == (2^eq q_i)(2^ek k_i) exactly in double).
void DecodeVector(KvFormat format, const uint8_t* values,
                  const uint8_t* scales, int32_t d, float* out) {
  if (format == KvFormat::kFp8) {
    for (int32_t i = 0; i < d; ++i) out[i] = DecodeE4m3(values[i]);
  } else {
    for (int32_t i = 0; i < d; ++i) out[i] = Mxfp4Element(values, scales, i);
  }
}

double Dot(const float* a, const float* b, int32_t d) {
  // Four partial sums keep the loop short; double keeps the reference far
  // inside the checker's tolerance.
  double acc[4] = {0, 0, 0, 0};
  int32_t i = 0;
  for (; i + 4 <= d; i += 4) {
    for (int j = 0; j < 4; ++j) {
      acc[j] += static_cast<double>(a[i + j]) * static_cast<double>(b[i + j]);
    }
  }
  for (; i < d; ++i) acc[0] += static_cast<double>(a[i]) * b[i];
  return (acc[0] + acc[1]) + (acc[2] + acc[3]);
}

}  // namespace

ReferenceIndexer::ReferenceIndexer(std::vector<LayerSpec> layers,
                                   int32_t num_seqs)
    : layers_(std::move(layers)), num_seqs_(num_seqs) {
  entries_.assign(layers_.size(),
                  std::vector<std::vector<uint8_t>>(num_seqs_));
}

int ReferenceIndexer::LayerIndex(uint32_t layer) const {
  for (size_t i = 0; i < layers_.size(); ++i) {
    if (layers_[i].layer == layer) return static_cast<int>(i);
  }
  return -1;
}

absl::StatusOr<const LayerSpec*> ReferenceIndexer::Find(uint32_t layer) const {
  const int li = LayerIndex(layer);
  if (li < 0) {
    return absl::NotFoundError(absl::StrCat("reference: no layer ", layer));
  }
  return &layers_[li];
}

absl::Status ReferenceIndexer::Append(uint32_t layer, int32_t seq,
                                      absl::Span<const uint8_t> entries) {
  const int li = LayerIndex(layer);
  if (li < 0 || seq < 0 || seq >= num_seqs_) {
    return absl::NotFoundError(
        absl::StrCat("reference: no layer ", layer, " / sequence ", seq));
  }
  if (entries.size() % layers_[li].entry_bytes() != 0) {
    return absl::InvalidArgumentError(absl::StrCat(
        "reference: entries of layer ", layer, ": expected a multiple of ",
        layers_[li].entry_bytes(), " bytes, got ", entries.size()));
  }
  std::vector<uint8_t>& held = entries_[li][seq];
  held.insert(held.end(), entries.begin(), entries.end());
  return absl::OkStatus();
}

int64_t ReferenceIndexer::NumEntries(uint32_t layer, int32_t seq) const {
  const int li = LayerIndex(layer);
  if (li < 0 || seq < 0 || seq >= num_seqs_) return -1;
  return static_cast<int64_t>(entries_[li][seq].size()) /
         layers_[li].entry_bytes();
}

absl::Span<const uint8_t> ReferenceIndexer::Entry(uint32_t layer, int32_t seq,
                                                  int64_t e) const {
  const int li = LayerIndex(layer);
  const int32_t eb = layers_[li].entry_bytes();
  return absl::MakeConstSpan(entries_[li][seq]).subspan(e * eb, eb);
}

absl::StatusOr<std::vector<float>> ReferenceIndexer::Logits(
    uint32_t layer, int32_t seq, const QuantizedQ& q, int32_t row,
    int64_t visible) const {
  const int li = LayerIndex(layer);
  if (li < 0 || seq < 0 || seq >= num_seqs_) {
    return absl::NotFoundError(
        absl::StrCat("reference: no layer ", layer, " / sequence ", seq));
  }
  const LayerSpec& spec = layers_[li];
  const int32_t d = spec.head_dim;
  const int32_t h = spec.num_heads;
  const int32_t vb = spec.value_bytes();
  const int32_t sb = d / kMxBlock;
  const bool fp8 = spec.format == KvFormat::kFp8;
  if (visible < 0 || visible > NumEntries(layer, seq)) {
    return absl::InvalidArgumentError(absl::StrCat(
        "reference: layer ", layer, " sequence ", seq, " holds ",
        NumEntries(layer, seq), " entries, row asks for ", visible));
  }
  if (q.num_heads != h || row < 0 || row >= q.rows ||
      q.values.size() != static_cast<size_t>(q.rows) * h * vb ||
      q.weights.size() != static_cast<size_t>(q.rows) * h ||
      (!fp8 && q.scales.size() != static_cast<size_t>(q.rows) * h * sb)) {
    return absl::InvalidArgumentError(absl::StrCat(
        "reference: Q does not match layer ", layer, " (", spec.DebugString(),
        ") or row ", row, " is out of range"));
  }

  // The row's decoded queries [H, D] and weights [H].
  std::vector<float> qf(static_cast<size_t>(h) * d);
  const int64_t rh0 = static_cast<int64_t>(row) * h;
  for (int32_t hh = 0; hh < h; ++hh) {
    DecodeVector(spec.format, q.values.data() + (rh0 + hh) * vb,
                 fp8 ? nullptr : q.scales.data() + (rh0 + hh) * sb, d,
                 qf.data() + static_cast<size_t>(hh) * d);
  }
  const float* w = q.weights.data() + rh0;

  std::vector<float> logits(static_cast<size_t>(visible));
  std::vector<float> kf(d);
  for (int64_t e = 0; e < visible; ++e) {
    absl::Span<const uint8_t> entry = Entry(layer, seq, e);
    DecodeVector(spec.format, entry.data(), entry.data() + vb, d, kf.data());
    double sum = 0;
    for (int32_t hh = 0; hh < h; ++hh) {
      const double dot = Dot(qf.data() + static_cast<size_t>(hh) * d,
                             kf.data(), d);
      sum += static_cast<double>(w[hh]) * std::max(dot, 0.0);
    }
    if (fp8) {
      float kscale;
      std::memcpy(&kscale, entry.data() + vb, sizeof kscale);
      sum *= kscale;
    }
    logits[e] = static_cast<float>(sum);
  }
  return logits;
}

absl::StatusOr<std::vector<float>> ReferenceIndexer::BlockScores(
    uint32_t layer, int32_t seq, absl::Span<const float> q, int32_t row,
    int32_t head, int64_t visible) const {
  const int li = LayerIndex(layer);
  if (li < 0 || seq < 0 || seq >= num_seqs_) {
    return absl::NotFoundError(
        absl::StrCat("reference: no layer ", layer, " / sequence ", seq));
  }
  const LayerSpec& spec = layers_[li];
  const int32_t d = spec.head_dim;
  const int32_t vb = spec.value_bytes();
  if (!spec.is_block() || row < 0 || head < 0 || head >= spec.num_heads ||
      q.size() < static_cast<size_t>(row + 1) * spec.num_heads * d) {
    return absl::InvalidArgumentError(absl::StrCat(
        "reference: layer ", layer, " is not a block layer, or Q does not "
        "hold row ", row, " head ", head));
  }
  if (visible < 0 || visible > NumEntries(layer, seq)) {
    return absl::InvalidArgumentError(absl::StrCat(
        "reference: layer ", layer, " sequence ", seq, " holds ",
        NumEntries(layer, seq), " entries, row asks for ", visible));
  }
  const float* qh =
      q.data() + (static_cast<size_t>(row) * spec.num_heads + head) * d;
  const int32_t e_per_block = spec.page_entries;
  std::vector<float> scores(
      static_cast<size_t>(CausalBlocks(visible, e_per_block)));
  std::vector<float> kf(d);
  for (size_t b = 0; b < scores.size(); ++b) {
    double best = -std::numeric_limits<double>::infinity();
    const int64_t end = std::min<int64_t>(visible, (b + 1) * e_per_block);
    for (int64_t e = static_cast<int64_t>(b) * e_per_block; e < end; ++e) {
      absl::Span<const uint8_t> entry = Entry(layer, seq, e);
      DecodeVector(spec.format, entry.data(), entry.data() + vb, d, kf.data());
      double kscale = 1;
      if (spec.format == KvFormat::kFp8) {
        float s;
        std::memcpy(&s, entry.data() + vb, sizeof s);
        kscale = s;
      }
      best = std::max(best, spec.scale * kscale * Dot(qh, kf.data(), d));
    }
    scores[b] = static_cast<float>(best);
  }
  ApplyBlockSentinels(spec.init_blocks, spec.local_blocks,
                      absl::MakeSpan(scores));
  return scores;
}

// -------------------------------------------------------- candidate pools --

std::vector<float> BlockMaxima(absl::Span<const float> logits,
                               int32_t block_size) {
  const int64_t n = static_cast<int64_t>(logits.size());
  std::vector<float> maxima((n + block_size - 1) / block_size,
                            -std::numeric_limits<float>::infinity());
  for (int64_t e = 0; e < n; ++e) {
    float& m = maxima[e / block_size];
    m = std::max(m, logits[e]);
  }
  return maxima;
}

namespace {

// The blocks competing for the pool's open slots, best first (larger
// maximum, then smaller id), and the number of slots. With pinning the
// newest block holds one slot outright: the pool is it plus the best
// topk_blocks - 1 others, which is the "replace the weakest" rule.
// REQUIRES: maxima.size() > topk_blocks.
std::vector<int32_t> RankedCandidates(absl::Span<const float> maxima,
                                      int32_t topk_blocks, bool pin_newest,
                                      int32_t& slots) {
  const int32_t nb = static_cast<int32_t>(maxima.size());
  std::vector<int32_t> order;
  for (int32_t b = 0; b < nb - (pin_newest ? 1 : 0); ++b) order.push_back(b);
  std::stable_sort(order.begin(), order.end(), [&](int32_t a, int32_t b) {
    return maxima[a] > maxima[b];
  });
  slots = pin_newest ? topk_blocks - 1 : topk_blocks;
  return order;
}

}  // namespace

std::vector<int32_t> SelectCandidatePool(absl::Span<const float> maxima,
                                         int32_t topk_blocks,
                                         bool pin_newest) {
  const int32_t nb = static_cast<int32_t>(maxima.size());
  std::vector<int32_t> pool;
  if (nb <= topk_blocks) {
    for (int32_t b = 0; b < nb; ++b) pool.push_back(b);
    return pool;
  }
  int32_t slots = 0;
  pool = RankedCandidates(maxima, topk_blocks, pin_newest, slots);
  pool.resize(slots);
  if (pin_newest) pool.push_back(nb - 1);
  std::sort(pool.begin(), pool.end());
  return pool;
}

PoolBounds BoundCandidatePool(absl::Span<const float> maxima,
                              int32_t topk_blocks, bool pin_newest,
                              double slack) {
  const int32_t nb = static_cast<int32_t>(maxima.size());
  PoolBounds out;
  if (nb <= topk_blocks) {
    out.sure = SelectCandidatePool(maxima, topk_blocks, pin_newest);
    return out;
  }
  int32_t slots = 0;
  const std::vector<int32_t> ranked =
      RankedCandidates(maxima, topk_blocks, pin_newest, slots);
  if (pin_newest) out.sure.push_back(nb - 1);
  if (slots > 0) {
    // The daemon's maxima may sit up to `slack` off the reference's on
    // either side: a block is surely in when it beats the best excluded
    // block by more than 2 * slack, surely out when the worst included one
    // beats it by more.
    const double worst_in = maxima[ranked[slots - 1]];
    const double best_out = maxima[ranked[slots]];
    const double margin = 2 * slack;
    for (int32_t b : ranked) {
      if (maxima[b] > best_out + margin) {
        out.sure.push_back(b);
      } else if (maxima[b] >= worst_in - margin) {
        out.maybe.push_back(b);
      }
    }
  }
  std::sort(out.sure.begin(), out.sure.end());
  std::sort(out.maybe.begin(), out.maybe.end());
  return out;
}

// ----------------------------------------------------------- block path --

void ApplyBlockSentinels(int32_t init_blocks, int32_t local_blocks,
                         absl::Span<float> scores) {
  const int64_t nb = static_cast<int64_t>(scores.size());
  for (int64_t b = std::max<int64_t>(0, nb - local_blocks); b < nb; ++b) {
    scores[b] = kLocalBlockScore;
  }
  for (int64_t b = 0; b < std::min<int64_t>(nb, init_blocks); ++b) {
    scores[b] = kInitBlockScore;
  }
}

int64_t CausalBlocks(int64_t visible, int32_t page_entries) {
  return PagesFor(visible, page_entries);  // blocks are pages
}

// --------------------------------------------------------------- checker --

std::vector<int64_t> ReplyRowBounds(const LayerSpec& spec, absl::Span<const int64_t> old_tokens,
                                    absl::Span<const int64_t> q_lens) {
  std::vector<int64_t> bounds;
  for (size_t s = 0; s < q_lens.size(); ++s) {
    for (int64_t i = 0; i < q_lens[s]; ++i) {
      const int64_t visible = VisibleEntries(old_tokens[s] + i, spec.compress_ratio);
      bounds.push_back(spec.is_block() ? CausalBlocks(visible, spec.page_entries) : visible);
    }
  }
  return bounds;
}

namespace {

RowVerdict Fail(std::string problem) {
  return RowVerdict{false, std::move(problem)};
}

// The shape part of the rule: between `min_count` and `max_count` indices
// first, then -1 only; each index in [0, n), allowed (`allowed` empty: all
// are) and not repeated. Sets `count` to the number of indices.
RowVerdict CheckIndices(absl::Span<const int32_t> got, int64_t n,
                        int64_t min_count, int64_t max_count,
                        const std::vector<char>& allowed, const char* noun,
                        int64_t& count) {
  count = 0;
  for (int32_t idx : got) count += idx != -1;
  if (count < min_count || count > max_count) {
    const std::string want =
        min_count == max_count
            ? absl::StrCat(min_count)
            : absl::StrCat("between ", min_count, " and ", max_count);
    return Fail(absl::StrCat("expected ", want, " indices (topk ", got.size(),
                             ", visible ", n, "), got ", count));
  }
  for (int64_t i = 0; i < count; ++i) {
    if (got[i] == -1) {
      return Fail(absl::StrCat("-1 at slot ", i, " before the last index "
                               "(expected ", count, " indices first)"));
    }
  }
  std::vector<char> seen(static_cast<size_t>(n), 0);
  for (int64_t i = 0; i < count; ++i) {
    const int32_t idx = got[i];
    if (idx < 0 || idx >= n) {
      return Fail(absl::StrCat("slot ", i, " holds ", idx,
                               ", expected ", noun, " in [0, ", n, ")"));
    }
    if (!allowed.empty() && !allowed[idx]) {
      return Fail(absl::StrCat("entry ", idx, " is outside the row's "
                               "candidate pool"));
    }
    if (seen[idx]) {
      return Fail(absl::StrCat(noun, " ", idx, " returned twice"));
    }
    seen[idx] = 1;
  }
  return RowVerdict{};
}

// The k-th largest of `values`, or -infinity when there are fewer than k.
double KthLargest(std::vector<float> values, int64_t k) {
  if (k < 1 || static_cast<int64_t>(values.size()) < k) {
    return -std::numeric_limits<double>::infinity();
  }
  std::nth_element(values.begin(), values.begin() + (k - 1), values.end(),
                   std::greater<float>());
  return values[k - 1];
}

// The score part, given bounds on the answer's k-th score: each of the
// first `count` indices scores >= `kth_floor` - slack, and every index of
// `must_hold` scoring above `kth_ceiling` + slack is among them, so a near
// tie at the cut cannot push out a clear winner.
RowVerdict CheckScores(absl::Span<const float> scores,
                       absl::Span<const int32_t> got, int64_t count,
                       double kth_floor, double kth_ceiling, double slack,
                       const std::vector<int32_t>& must_hold,
                       const char* noun) {
  std::vector<char> held(scores.size(), 0);
  for (int64_t i = 0; i < count; ++i) {
    const int32_t idx = got[i];
    held[idx] = 1;
    if (scores[idx] < kth_floor - slack) {
      return Fail(absl::StrCat(
          noun, " ", idx, " scores ", scores[idx], ", below the reference's ",
          got.size(), "-th score ", kth_floor, " minus tolerance ", slack));
    }
  }
  for (int32_t idx : must_hold) {
    if (!held[idx] && scores[idx] > kth_ceiling + slack) {
      return Fail(absl::StrCat(
          noun, " ", idx, " is missing though it scores ", scores[idx],
          ", above the reference's ", got.size(), "-th score ", kth_ceiling,
          " plus tolerance ", slack));
    }
  }
  return RowVerdict{};
}

// The whole rule over all of `scores` with a given slack.
RowVerdict CheckTopkRowWithSlack(absl::Span<const float> scores,
                                 absl::Span<const int32_t> got, double slack,
                                 const char* noun) {
  const int64_t n = static_cast<int64_t>(scores.size());
  const int64_t k = static_cast<int64_t>(got.size());
  const int64_t expected = std::min(k, n);
  int64_t count = 0;
  RowVerdict shape = CheckIndices(got, n, expected, expected, {}, noun, count);
  if (!shape.ok || n <= k) return shape;  // all of [0, n) present
  std::vector<int32_t> all(static_cast<size_t>(n));
  for (int64_t i = 0; i < n; ++i) all[i] = static_cast<int32_t>(i);
  const double kth =
      KthLargest(std::vector<float>(scores.begin(), scores.end()), k);
  return CheckScores(scores, got, count, kth, kth, slack, all, noun);
}

}  // namespace

RowVerdict CheckReplyShape(const LayerSpec& spec, absl::Span<const int64_t> bounds,
                           absl::Span<const int32_t> topk) {
  const int64_t k = spec.topk, rows = static_cast<int64_t>(bounds.size());
  const int64_t planes = spec.is_block() ? spec.num_heads : 1;
  if (k <= 0 || static_cast<int64_t>(topk.size()) != planes * rows * k) {
    return Fail(absl::StrCat("reply holds ", topk.size(), " indices, expected ", planes, " x ", rows,
                             " x ", k));
  }
  const char* noun = spec.is_block() ? "block" : "entry";
  for (int64_t h = 0; h < planes; ++h) {
    for (int64_t r = 0; r < rows; ++r) {
      const int64_t want = std::min(k, bounds[r]);
      // A consumer's pool may hold fewer, never none (its newest block).
      const int64_t least = spec.is_consumer() ? std::min<int64_t>(want, 1) : want;
      int64_t count = 0;
      RowVerdict v = CheckIndices(topk.subspan((h * rows + r) * k, k), bounds[r], least, want, {}, noun, count);
      if (!v.ok) {
        v.problem = absl::StrCat(spec.is_block() ? absl::StrCat("head ", h, " ") : "", "row ", r, ": ", v.problem);
        return v;
      }
    }
  }
  return RowVerdict{};
}

double TopkSlack(absl::Span<const float> logits,
                 const TopkTolerance& tolerance) {
  double max_abs = 0;
  for (float x : logits) max_abs = std::max(max_abs, std::fabs(double{x}));
  return tolerance.relative * max_abs + tolerance.absolute;
}

RowVerdict CheckTopkRow(absl::Span<const float> logits,
                        absl::Span<const int32_t> got,
                        const TopkTolerance& tolerance) {
  return CheckTopkRowWithSlack(logits, got, TopkSlack(logits, tolerance),
                               "entry");
}

RowVerdict CheckBlockRow(absl::Span<const float> scores,
                         absl::Span<const int32_t> got,
                         const TopkTolerance& tolerance) {
  // Sentinels would make the slack huge; only real scores set it.
  std::vector<float> real;
  for (float x : scores) {
    if (x < kLocalBlockScore) real.push_back(x);
  }
  return CheckTopkRowWithSlack(scores, got, TopkSlack(real, tolerance),
                               "block");
}

RowVerdict CheckConsumerRow(absl::Span<const float> logits,
                            const PoolBounds& pool, int32_t block_size,
                            absl::Span<const int32_t> got,
                            const TopkTolerance& tolerance) {
  const int64_t n = static_cast<int64_t>(logits.size());
  const int64_t k = static_cast<int64_t>(got.size());
  // Entries of the row's pool that it sees: the sure ones, then all.
  std::vector<char> allowed(static_cast<size_t>(n), 0);
  std::vector<float> sure_scores, pool_scores;
  std::vector<int32_t> sure_entries;
  auto add_blocks = [&](const std::vector<int32_t>& blocks, bool sure) {
    for (int32_t b : blocks) {
      const int64_t end = std::min<int64_t>(n, int64_t{b + 1} * block_size);
      for (int64_t e = int64_t{b} * block_size; e < end; ++e) {
        allowed[e] = 1;
        pool_scores.push_back(logits[e]);
        if (!sure) continue;
        sure_scores.push_back(logits[e]);
        sure_entries.push_back(static_cast<int32_t>(e));
      }
    }
  };
  add_blocks(pool.sure, true);
  add_blocks(pool.maybe, false);
  const int64_t min_count = std::min<int64_t>(k, sure_scores.size());
  const int64_t max_count = std::min<int64_t>(k, pool_scores.size());
  int64_t count = 0;
  RowVerdict shape = CheckIndices(got, n, min_count, max_count, allowed,
                                  "entry", count);
  if (!shape.ok) return shape;
  // The daemon's pool lies between the sure blocks and sure + maybe, so its
  // k-th score lies between theirs (the same value when unambiguous).
  const double slack = TopkSlack(pool_scores, tolerance);
  const double kth_floor = KthLargest(std::move(sure_scores), k);
  const double kth_ceiling = KthLargest(std::move(pool_scores), k);
  return CheckScores(logits, got, count, kth_floor, kth_ceiling, slack,
                     sure_entries, "entry");
}

void AgreementReport::Add(const std::string& label,
                          const RowVerdict& verdict) {
  ++rows_;
  if (verdict.ok) {
    ++agreeing_;
  } else if (problems_.size() < kMaxProblems) {
    problems_.push_back(absl::StrCat(label, ": ", verdict.problem));
  }
}

void AgreementReport::Merge(const AgreementReport& other) {
  rows_ += other.rows_;
  agreeing_ += other.agreeing_;
  for (const std::string& p : other.problems_) {
    if (problems_.size() >= kMaxProblems) break;
    problems_.push_back(p);
  }
}

}  // namespace indexer::client

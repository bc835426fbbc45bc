#include "client/reference.h"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <functional>
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
    spec.role = l.role();
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
    spec.topk = static_cast<int32_t>(l.topk());
    if (spec.head_dim <= 0 || spec.head_dim % kMxBlock != 0) {
      return absl::InvalidArgumentError(absl::StrCat(
          "server info: group '", g.name(), "' head_dim: expected a positive "
          "multiple of 32, got ", g.head_dim()));
    }
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
  return specs;
}

// ------------------------------------------------------ token arithmetic --

int64_t EntriesForTokens(int64_t tokens, int32_t compress_ratio) {
  return tokens / compress_ratio;
}

int64_t NewEntries(int64_t old_tokens, int64_t q_len, int32_t compress_ratio) {
  return (old_tokens + q_len) / compress_ratio - old_tokens / compress_ratio;
}

int64_t VisibleEntries(int64_t position, int32_t compress_ratio) {
  return (position + 1) / compress_ratio;
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

// --------------------------------------------------------------- checker --

RowVerdict CheckTopkRow(absl::Span<const float> logits,
                        absl::Span<const int32_t> got,
                        const TopkTolerance& tolerance) {
  const int64_t n = static_cast<int64_t>(logits.size());
  const int64_t k = static_cast<int64_t>(got.size());
  const int64_t expected = std::min(k, n);
  auto fail = [](std::string problem) {
    return RowVerdict{false, std::move(problem)};
  };

  int64_t valid = 0;
  for (int32_t idx : got) valid += idx != -1;
  if (valid != expected) {
    return fail(absl::StrCat("expected min(topk ", k, ", visible ", n,
                             ") = ", expected, " indices, got ", valid));
  }
  for (int64_t i = 0; i < expected; ++i) {
    if (got[i] == -1) {
      return fail(absl::StrCat("-1 at slot ", i, " before the last index "
                               "(expected ", expected, " indices first)"));
    }
  }

  std::vector<char> seen(static_cast<size_t>(n), 0);
  for (int64_t i = 0; i < expected; ++i) {
    const int32_t idx = got[i];
    if (idx < 0 || idx >= n) {
      return fail(absl::StrCat("slot ", i, " holds ", idx,
                               ", expected an entry in [0, ", n, ")"));
    }
    if (seen[idx]) {
      return fail(absl::StrCat("entry ", idx, " returned twice"));
    }
    seen[idx] = 1;
  }
  if (n <= k) return RowVerdict{};  // all of [0, n) present, checked above

  std::vector<float> sorted(logits.begin(), logits.end());
  std::nth_element(sorted.begin(), sorted.begin() + (k - 1), sorted.end(),
                   std::greater<float>());
  const double kth = sorted[k - 1];
  double max_abs = 0;
  for (float x : logits) max_abs = std::max(max_abs, std::fabs(double{x}));
  const double slack = tolerance.relative * max_abs + tolerance.absolute;
  for (int64_t i = 0; i < expected; ++i) {
    const int32_t idx = got[i];
    if (logits[idx] < kth - slack) {
      return fail(absl::StrCat(
          "entry ", idx, " scores ", logits[idx], ", below the reference's ",
          k, "-th score ", kth, " minus tolerance ", slack));
    }
  }
  return RowVerdict{};
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

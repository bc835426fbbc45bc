// Helpers of the cpu backend's path tests (candidate, block): synthetic
// steps, K entries and queries, and their decoded values for plain
// double-precision references.
//
// "Exact" data draws every K / Q value from a small alphabet (e4m3 / e2m1
// values with power-of-two scales) and weights from {-1, 0.5, 1, 2}, so every
// fp32 logit the backend computes is exact in any summation order: the
// references compare bit for bit and the many equal scores exercise the tie
// rules. "Noisy" data goes through the codecs from normal floats.
#pragma once

#include <algorithm>
#include <cstdint>
#include <cstring>
#include <random>
#include <vector>

#include "kernels/backend.h"
#include "kernels/format/fp8.h"
#include "kernels/format/mxfp4.h"
#include "kernels/format/page_layout.h"
#include "kernels/geometry/step_geometry.h"

namespace indexer {
namespace testutil {

// One sequence of a step, in tokens: `old_tokens` before it, `q_len` rows.
struct SeqPlan {
  int32_t old_tokens;
  int32_t q_len;
};

// A step that writes every entry of each sequence (old ones included, so one
// step fills the cache) and has rows for the last q_len tokens, over a
// shuffled block table of pages [0, NumPages(rows)), in chunks of at most
// `chunk_rows` rows.
inline StepRows BuildStep(const std::vector<SeqPlan>& plans, int32_t ratio,
                          int32_t page_entries, int32_t chunk_rows,
                          std::mt19937* rng) {
  std::vector<int64_t> old_tokens, q_lens, cached(plans.size(), 0);
  std::vector<int32_t> counts;
  int32_t total_pages = 0;
  for (const SeqPlan& p : plans) {
    old_tokens.push_back(p.old_tokens);
    q_lens.push_back(p.q_len);
    counts.push_back(static_cast<int32_t>(PagesForTokens(p.old_tokens + p.q_len, ratio, page_entries)));
    total_pages += counts.back();
  }
  std::vector<int32_t> order(total_pages);
  for (int32_t i = 0; i < total_pages; ++i) order[i] = i;
  std::shuffle(order.begin(), order.end(), *rng);
  std::vector<std::vector<int32_t>> pages;
  size_t next = 0;
  for (int32_t n : counts) {
    pages.emplace_back(order.begin() + next, order.begin() + next + n);
    next += n;
  }
  StepRows rows = BuildStepRowsFromPages(old_tokens, q_lens, pages, ratio, INT64_MAX, cached);
  rows.chunks = EvenChunks(rows.num_rows, chunk_rows);
  return rows;
}

inline int32_t NumPages(const StepRows& rows) {
  int32_t pages = 1;
  for (int32_t p : rows.block_table) pages = std::max(pages, p + 1);
  return pages;
}

// The FP8 code of `v` in variant `var`. REQUIRES: v is a value of it.
inline uint8_t E4m3Code(float v, Fp8Variant var = Fp8Variant::kE4m3fn) {
  for (int c = 0; c < 256; ++c) {
    if (DecodeFp8(var, static_cast<uint8_t>(c)) == v)
      return static_cast<uint8_t>(c);
  }
  return 0;
}

// Linear K entries of every sequence in the step's K order, [n, VB + SB].
inline std::vector<uint8_t> MakeEntries(const PageLayout& layout, int64_t n,
                                        bool exact, std::mt19937* rng) {
  const int32_t dim = layout.head_dim, vb = layout.value_bytes();
  const int32_t eb = layout.entry_bytes();
  std::vector<uint8_t> out(static_cast<size_t>(n) * eb);
  static const float kValues[] = {0, 0.5f, -0.5f, 1, -1, 1.5f, -1.5f, 2, 3, -3};
  std::uniform_int_distribution<int> value(0, 9), nibble(0, 15), exp(-1, 1);
  std::normal_distribution<float> normal;
  std::vector<float> x(dim);
  for (int64_t i = 0; i < n; ++i) {
    uint8_t* e = out.data() + i * eb;
    if (layout.format == KvFormat::kFp8) {
      float scale;
      if (exact) {
        for (int32_t d = 0; d < dim; ++d) e[d] = E4m3Code(kValues[value(*rng)], layout.fp8);
        scale = std::ldexp(1.0f, exp(*rng));
      } else {
        for (float& v : x) v = normal(*rng);
        scale = QuantizeFp8Entry(x.data(), dim, true, e, layout.fp8);
      }
      std::memcpy(e + vb, &scale, sizeof scale);
    } else if (exact) {
      for (int32_t b = 0; b < vb; ++b) {
        e[b] = static_cast<uint8_t>(nibble(*rng) | nibble(*rng) << 4);
      }
      for (int32_t s = 0; s < dim / kMxBlock; ++s) {
        e[vb + s] = static_cast<uint8_t>(127 + exp(*rng));
      }
    } else {
      for (float& v : x) v = normal(*rng);
      QuantizeMxfp4(x.data(), dim, e, e + vb);
    }
  }
  return out;
}

// Decoded K of linear entry i: [D] values (MXFP4 block scales applied) and
// its FP8 scale (1 for MXFP4).
inline std::vector<double> DecodeK(const PageLayout& layout,
                                   const std::vector<uint8_t>& entries,
                                   int64_t i, double* scale) {
  const int32_t dim = layout.head_dim, vb = layout.value_bytes();
  const uint8_t* e = entries.data() + i * layout.entry_bytes();
  std::vector<double> k(dim);
  *scale = 1.0;
  if (layout.format == KvFormat::kFp8) {
    for (int32_t d = 0; d < dim; ++d) k[d] = DecodeFp8(layout.fp8, e[d]);
    float s;
    std::memcpy(&s, e + vb, sizeof s);
    *scale = s;
  } else {
    for (int32_t d = 0; d < dim; ++d) k[d] = Mxfp4Element(e, e + vb, d);
  }
  return k;
}

// Index queries of the token paths and their decoded values.
struct TestQ {
  std::vector<uint8_t> values;  // [rows, H, VB]
  std::vector<uint8_t> scales;  // [rows, H, D/32] (MXFP4)
  std::vector<float> weights;   // [rows, H]
  std::vector<double> decoded;  // [rows, H, D]
  QInput input(int32_t heads) const {
    return QInput{heads, values.data(),
                  scales.empty() ? nullptr : scales.data(), weights.data()};
  }
};

inline TestQ MakeQ(const PageLayout& layout, int32_t rows, int32_t heads,
                   bool exact, std::mt19937* rng) {
  const int32_t dim = layout.head_dim, vb = layout.value_bytes();
  const int32_t sb = dim / kMxBlock;
  const bool fp8 = layout.format == KvFormat::kFp8;
  TestQ q;
  const int64_t n = static_cast<int64_t>(rows) * heads;
  q.values.resize(static_cast<size_t>(n) * vb);
  if (!fp8) q.scales.resize(static_cast<size_t>(n) * sb);
  q.weights.resize(static_cast<size_t>(n));
  q.decoded.resize(static_cast<size_t>(n) * dim);
  static const float kValues[] = {0, 0.5f, -1, 1, 1.5f, 2, -2, 3};
  static const float kWeights[] = {-1, 0.5f, 1, 2};
  std::uniform_int_distribution<int> value(0, 7), weight(0, 3), nibble(0, 15),
      exp(-1, 1);
  std::normal_distribution<float> normal;
  std::uniform_real_distribution<float> uw(-0.5f, 1.0f);
  std::vector<float> x(dim);
  for (int64_t rh = 0; rh < n; ++rh) {
    uint8_t* v = q.values.data() + rh * vb;
    uint8_t* s = fp8 ? nullptr : q.scales.data() + rh * sb;
    float w_scale = 1.0f;
    if (exact) {
      if (fp8) {
        for (int32_t d = 0; d < dim; ++d) v[d] = E4m3Code(kValues[value(*rng)], layout.fp8);
      } else {
        for (int32_t b = 0; b < vb; ++b) {
          v[b] = static_cast<uint8_t>(nibble(*rng) | nibble(*rng) << 4);
        }
        for (int32_t i = 0; i < sb; ++i)
          s[i] = static_cast<uint8_t>(127 + exp(*rng));
      }
      q.weights[rh] = kWeights[weight(*rng)];
    } else {
      for (float& f : x) f = normal(*rng);
      if (fp8) {
        w_scale = QuantizeFp8Q(x.data(), dim, v, layout.fp8);
      } else {
        QuantizeMxfp4(x.data(), dim, v, s);
      }
      q.weights[rh] = uw(*rng) * w_scale;
    }
    for (int32_t d = 0; d < dim; ++d) {
      q.decoded[rh * dim + d] = fp8 ? DecodeFp8(layout.fp8, v[d]) : Mxfp4Element(v, s, d);
    }
  }
  return q;
}

// Every written entry decoded once: k [n, D] and the FP8 scales [n] (1 for
// MXFP4).
struct DecodedK {
  std::vector<double> k;
  std::vector<double> scale;
};

inline DecodedK DecodeAll(const PageLayout& layout,
                          const std::vector<uint8_t>& entries) {
  const int64_t n = static_cast<int64_t>(entries.size()) / layout.entry_bytes();
  DecodedK out;
  out.k.reserve(static_cast<size_t>(n) * layout.head_dim);
  for (int64_t i = 0; i < n; ++i) {
    double scale;
    const std::vector<double> k = DecodeK(layout, entries, i, &scale);
    out.k.insert(out.k.end(), k.begin(), k.end());
    out.scale.push_back(scale);
  }
  return out;
}

// Double-precision logits of row r over entries [0, row_visible[r]) (SPEC
// §5 dense token path).
inline std::vector<double> RefLogits(const PageLayout& layout,
                                     const StepRows& rows, const DecodedK& kd,
                                     const TestQ& q, int32_t heads, int32_t r) {
  const int32_t dim = layout.head_dim, s = rows.row_seq[r];
  std::vector<double> logits(rows.row_visible[r]);
  for (int32_t e = 0; e < rows.row_visible[r]; ++e) {
    const int64_t i = int64_t{rows.seq_k_begin[s]} + e;
    const double* k = kd.k.data() + i * dim;
    double sum = 0;
    for (int32_t h = 0; h < heads; ++h) {
      const double* qh = q.decoded.data() + (int64_t{r} * heads + h) * dim;
      double dot = 0;
      for (int32_t d = 0; d < dim; ++d) dot += qh[d] * k[d];
      sum += q.weights[int64_t{r} * heads + h] * std::max(dot, 0.0);
    }
    logits[e] = kd.scale[i] * sum;
  }
  return logits;
}

// The reference selection: the k largest of values[i] (ties -> smaller
// ids[i]), returned as ids sorted ascending.
inline std::vector<int32_t> RefTopIds(const std::vector<double>& values,
                                      const std::vector<int32_t>& ids,
                                      int32_t k) {
  std::vector<size_t> order(values.size());
  for (size_t i = 0; i < order.size(); ++i) order[i] = i;
  std::sort(order.begin(), order.end(), [&](size_t a, size_t b) {
    if (values[a] != values[b]) return values[a] > values[b];
    return ids[a] < ids[b];
  });
  std::vector<int32_t> top;
  for (size_t i = 0; i < order.size() && static_cast<int32_t>(i) < k; ++i) {
    top.push_back(ids[order[i]]);
  }
  std::sort(top.begin(), top.end());
  return top;
}

// A row of a [rows, k] result as an ascending set, or {-2} when it breaks
// the row format (a -1 before an id, or a repeated id).
inline std::vector<int32_t> RowSet(const int32_t* row, int32_t k) {
  std::vector<int32_t> ids;
  bool ended = false;
  for (int32_t i = 0; i < k; ++i) {
    if (row[i] == -1) {
      ended = true;
    } else if (ended || row[i] < 0) {
      return {-2};
    } else {
      ids.push_back(row[i]);
    }
  }
  std::sort(ids.begin(), ids.end());
  if (std::adjacent_find(ids.begin(), ids.end()) != ids.end()) return {-2};
  return ids;
}

}  // namespace testutil
}  // namespace indexer

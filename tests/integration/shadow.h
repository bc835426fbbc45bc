// A client-side shadow of the daemon's cache for the integration tests: it
// generates a step's inputs (random K, Q, weights), keeps every committed
// entry in linear quantized form, and checks returned top-k rows against
// reference.h. Used by the engine tests and the end-to-end tests alike.
#pragma once

#include <cstdint>
#include <map>
#include <set>
#include <random>
#include <string>
#include <utility>
#include <vector>

#include "kernels/format/fp8.h"
#include "kernels/format/mxfp4.h"
#include "kernels/format/page_layout.h"
#include "kernels/geometry/step_geometry.h"
#include "tests/integration/reference.h"

namespace indexer::testing {

enum class Role { kDense, kSource, kConsumer, kBlock };

struct TestLayer {
  int32_t layer = 0;
  PageLayout layout;
  int32_t compress_ratio = 1;
  bool ue8m0 = true;
  int32_t num_heads = 8;
  int32_t topk = 16;  // topk_blocks for block layers
  Role role = Role::kDense;
  // Candidate roles.
  int32_t source = -1;
  int32_t cand_block = 8;
  int32_t cand_topk_blocks = 4;
  bool pin_newest = true;
  // Block role.
  int32_t init_blocks = 0;
  int32_t local_blocks = 1;
  float scale = 1.0f;
};

// One layer's inputs for one step, in every form a test may send.
struct LayerData {
  int64_t n_new = 0;
  int64_t rows = 0;
  std::vector<float> k_float;     // [n_new, D]
  std::vector<uint8_t> k_quant;   // [n_new, VB + SB] linear entries
  std::vector<float> q_float;     // [rows, H, D]
  std::vector<float> weights;     // [rows, H], goes with q_float
  std::vector<uint8_t> q_codes;   // [rows, H, VB] quantized as the daemon does
  std::vector<uint8_t> q_scales;  // [rows, H, D/32] (MXFP4)
  std::vector<float> w_folded;    // [rows, H], goes with q_codes
};

using SeqStep = std::pair<std::string, int64_t>;  // (sequence, q_len)

class Shadow {
 public:
  Shadow(std::vector<TestLayer> layers, uint64_t seed) : layers_(std::move(layers)), rng_(seed) {}

  const std::vector<TestLayer>& layers() const { return layers_; }
  int64_t len(const std::string& s) const {
    auto it = len_.find(s);
    return it == len_.end() ? 0 : it->second;
  }

  // Committed entry `e` of sequence `s` in layer `layer`, decoded in the
  // shadow layer's layout. REQUIRES: it was committed.
  RefEntry Entry(int32_t layer, const std::string& s, int64_t e) const {
    for (const TestLayer& t : layers_) {
      if (t.layer != layer) continue;
      const auto& all = entries_.at({layer, s});
      return DecodeEntry(t.layout, &all[e * t.layout.entry_bytes()]);
    }
    return {};
  }

  // Inputs of every layer for a step over `seqs` (nothing recorded yet).
  std::vector<LayerData> Make(const std::vector<SeqStep>& seqs) {
    std::vector<LayerData> out;
    for (const TestLayer& t : layers_) out.push_back(MakeLayer(t, seqs));
    return out;
  }

  // K entries only (no Q, no weights) for an import of `seqs`: what
  // WriteEntries sends, without the cost of prefill-sized Q tensors.
  std::vector<LayerData> MakeEntries(const std::vector<SeqStep>& seqs) {
    std::vector<LayerData> out;
    for (const TestLayer& t : layers_) out.push_back(MakeLayer(t, seqs, /*with_q=*/false));
    return out;
  }

  // Forgets a released sequence.
  void Forget(const std::string& s) {
    len_.erase(s);
    for (auto it = entries_.begin(); it != entries_.end();) {
      it = it->first.second == s ? entries_.erase(it) : std::next(it);
    }
  }

  // Records a committed step's new entries.
  void Commit(const std::vector<SeqStep>& seqs, const std::vector<LayerData>& data) {
    for (size_t li = 0; li < layers_.size(); ++li) {
      const TestLayer& t = layers_[li];
      const int eb = t.layout.entry_bytes();
      int64_t k = 0;
      for (const auto& [s, q_len] : seqs) {
        const int64_t n = NewEntriesFor(len(s), q_len, t.compress_ratio);
        auto& e = entries_[{t.layer, s}];
        e.insert(e.end(), data[li].k_quant.begin() + k * eb,
                 data[li].k_quant.begin() + (k + n) * eb);
        k += n;
      }
    }
    for (const auto& [s, q_len] : seqs) len_[s] += q_len;
  }

  // Checks the output of layer index `li` of a step over `seqs`, whose new
  // entries are data[li] (not yet committed). Dense and source layers by the
  // dense rule; a source also records each row's reference pool, which its
  // consumers are then checked against (rows whose pool cut is a near-tie
  // are counted in ambiguous_rows() and checked only for range and count).
  void Check(size_t li, const std::vector<SeqStep>& seqs, const LayerData& d,
             const int32_t* topk) {
    const TestLayer& t = layers_[li];
    const PageLayout& L = t.layout;
    const int eb = L.entry_bytes(), vb = L.value_bytes(), sb = L.head_dim / 32;
    int64_t row = 0, k = 0;
    for (const auto& [s, q_len] : seqs) {
      std::vector<uint8_t> all;
      auto it = entries_.find({t.layer, s});
      if (it != entries_.end()) all = it->second;
      const int64_t old = len(s);
      const int64_t n = NewEntriesFor(old, q_len, t.compress_ratio);
      all.insert(all.end(), d.k_quant.begin() + k * eb, d.k_quant.begin() + (k + n) * eb);
      k += n;
      std::vector<RefEntry> decoded;
      for (size_t e = 0; e * eb < all.size(); ++e) decoded.push_back(DecodeEntry(L, &all[e * eb]));
      for (int64_t j = 0; j < q_len; ++j, ++row) {
        const int64_t p = old + j;
        const int64_t visible = VisibleEntries(p, t.compress_ratio);
        const std::string where = "layer " + std::to_string(t.layer) + " seq " + s + " row " +
                                  std::to_string(row) + " (position " + std::to_string(p) + ")";
        if (t.role == Role::kBlock) {
          CheckBlockRow(t, d, decoded, row, visible, topk, where);
          continue;
        }
        const int64_t rh = row * t.num_heads;
        std::vector<std::vector<double>> q;
        for (int h = 0; h < t.num_heads; ++h) {
          q.push_back(DecodeVector(L, d.q_codes.data() + (rh + h) * vb,
                                   L.format == KvFormat::kMxfp4
                                       ? d.q_scales.data() + (rh + h) * sb
                                       : nullptr));
        }
        std::vector<double> logits(visible);
        for (int64_t e = 0; e < visible; ++e) {
          logits[e] = RefLogit(q, d.w_folded.data() + rh, decoded[e]);
        }
        if (t.role == Role::kSource) pools_[{t.layer, row}] = Pool(t, logits);
        if (t.role == Role::kConsumer) {
          ++consumer_rows_;
          const PoolRef& pool = pools_.at({t.source, row});
          if (pool.ambiguous) {
            // The daemon's pool is not known: only range and uniqueness.
            ++ambiguous_;
            std::set<int32_t> seen;
            for (int j = 0; j < t.topk; ++j) {
              const int32_t idx = topk[row * t.topk + j];
              if (idx == -1) continue;
              ASSERT_TRUE(idx >= 0 && idx < visible && seen.insert(idx).second) << where;
            }
            continue;
          } else {
            for (int64_t e = 0; e < visible; ++e) {
              if (!pool.blocks.count(e / t.cand_block)) logits[e] = -INFINITY;
            }
          }
        }
        ExpectTopkRow(logits, topk + row * t.topk, t.topk, where);
      }
    }
  }

  // Consumer rows checked, and those of them whose pool cut was a near-tie.
  int64_t consumer_rows() const { return consumer_rows_; }
  int64_t ambiguous_rows() const { return ambiguous_; }

 private:
  struct PoolRef {
    std::set<int64_t> blocks;
    bool ambiguous = false;
  };

  // SPEC §5 candidate pool of a row from its reference logits.
  static PoolRef Pool(const TestLayer& t, const std::vector<double>& logits) {
    const int64_t n = static_cast<int64_t>(logits.size());
    const int64_t nb = (n + t.cand_block - 1) / t.cand_block;
    std::vector<std::pair<double, int64_t>> maxima;
    double max_abs = 0;
    for (int64_t b = 0; b < nb; ++b) {
      double m = -INFINITY;
      for (int64_t e = b * t.cand_block; e < std::min(n, (b + 1) * t.cand_block); ++e) {
        m = std::max(m, logits[e]);
        max_abs = std::max(max_abs, std::abs(logits[e]));
      }
      maxima.push_back({-m, b});  // ascending = best first, ties to the smaller id
    }
    std::sort(maxima.begin(), maxima.end());
    PoolRef pool;
    const int64_t keep = std::min<int64_t>(nb, t.cand_topk_blocks);
    for (int64_t i = 0; i < keep; ++i) pool.blocks.insert(maxima[i].second);
    if (nb > keep) {
      const double tol = 1e-5 * max_abs + 1e-30;
      // Exact ties (e.g. blocks whose heads all ReLU to 0) resolve the same
      // way in both; only near-ties can differ between fp32 and double.
      auto near = [tol](double a, double b) { return a != b && std::abs(a - b) <= tol; };
      pool.ambiguous = near(maxima[keep - 1].first, maxima[keep].first);
      if (t.pin_newest && !pool.blocks.count(nb - 1)) {
        // The pinned newest block takes the weakest place; a near-tie for
        // that place is ambiguous too.
        pool.blocks.erase(maxima[keep - 1].second);
        pool.blocks.insert(nb - 1);
        if (keep >= 2) {
          pool.ambiguous |= near(maxima[keep - 2].first, maxima[keep - 1].first);
        }
      }
    }
    return pool;
  }

  // Block path: scores of the row's causal blocks with sentinels, top-k ids.
  void CheckBlockRow(const TestLayer& t, const LayerData& d, const std::vector<RefEntry>& decoded,
                     int64_t row, int64_t visible, const int32_t* out,
                     const std::string& where) const {
    const int D = t.layout.head_dim, E = t.layout.page_entries;
    const int64_t causal = (visible + E - 1) / E;
    for (int h = 0; h < t.num_heads; ++h) {
      const float* q = d.q_float.data() + (row * t.num_heads + h) * D;
      std::vector<double> score(causal, -INFINITY);
      for (int64_t e = 0; e < visible; ++e) {
        double dot = 0;
        for (int i = 0; i < D; ++i) dot += double(q[i]) * decoded[e].k[i];
        score[e / E] = std::max(score[e / E], double(t.scale) * dot);
      }
      for (int64_t b = std::max<int64_t>(0, causal - t.local_blocks); b < causal; ++b) score[b] = 1e29;
      for (int64_t b = 0; b < std::min<int64_t>(causal, t.init_blocks); ++b) score[b] = 1e30;
      const int64_t rows = d.rows;
      ExpectTopkRow(score, out + (h * rows + row) * t.topk, t.topk,
                    where + " head " + std::to_string(h));
    }
  }

  LayerData MakeLayer(const TestLayer& t, const std::vector<SeqStep>& seqs, bool with_q = true) {
    const PageLayout& L = t.layout;
    const int D = L.head_dim, H = t.num_heads, vb = L.value_bytes(), eb = L.entry_bytes();
    LayerData d;
    for (const auto& [s, q_len] : seqs) {
      d.n_new += NewEntriesFor(len(s), q_len, t.compress_ratio);
      d.rows += q_len;
    }
    std::normal_distribution<float> normal(0.f, 1.f);
    std::uniform_real_distribution<float> spread(-3.f, 3.f);
    d.k_float.resize(d.n_new * D);
    d.k_quant.resize(d.n_new * eb);
    for (int64_t e = 0; e < d.n_new; ++e) {
      const float mag = std::exp2(spread(rng_));  // entries of different amax
      for (int i = 0; i < D; ++i) d.k_float[e * D + i] = normal(rng_) * mag;
      uint8_t* out = d.k_quant.data() + e * eb;
      if (L.format == KvFormat::kFp8) {
        const float s = QuantizeFp8Entry(&d.k_float[e * D], D, t.ue8m0, out, L.fp8);
        memcpy(out + vb, &s, 4);
      } else {
        QuantizeMxfp4(&d.k_float[e * D], D, out, out + vb);
      }
    }
    if (!with_q) return d;
    d.q_float.resize(d.rows * H * D);
    for (float& x : d.q_float) x = normal(rng_);
    d.weights.resize(d.rows * H);
    for (float& w : d.weights) w = normal(rng_);  // negative weights too
    d.w_folded = d.weights;
    d.q_codes.resize(d.rows * H * vb);
    d.q_scales.resize(d.rows * H * (D / 32));
    for (int64_t rh = 0; rh < d.rows * H; ++rh) {
      if (L.format == KvFormat::kFp8) {
        d.w_folded[rh] *= QuantizeFp8Q(&d.q_float[rh * D], D, &d.q_codes[rh * vb], L.fp8);
      } else {
        QuantizeMxfp4(&d.q_float[rh * D], D, &d.q_codes[rh * vb], &d.q_scales[rh * (D / 32)]);
      }
    }
    return d;
  }

  std::vector<TestLayer> layers_;
  std::mt19937_64 rng_;
  std::map<std::string, int64_t> len_;
  std::map<std::pair<int32_t, std::string>, std::vector<uint8_t>> entries_;
  std::map<std::pair<int32_t, int64_t>, PoolRef> pools_;  // (source layer, row) this step
  int64_t ambiguous_ = 0;
  int64_t consumer_rows_ = 0;
};

}  // namespace indexer::testing

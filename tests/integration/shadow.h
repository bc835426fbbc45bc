// A client-side shadow of the daemon's cache for the integration tests: it
// generates a step's inputs (random K, Q, weights), keeps every committed
// entry in linear quantized form, and checks returned top-k rows against
// reference.h. Used by the engine tests and the end-to-end tests alike.
#pragma once

#include <cstdint>
#include <map>
#include <random>
#include <string>
#include <utility>
#include <vector>

#include "kernels/format/fp8.h"
#include "kernels/format/mxfp4.h"
#include "kernels/format/page_layout.h"
#include "tests/integration/reference.h"

namespace indexer::testing {

struct TestLayer {
  int32_t layer = 0;
  PageLayout layout;
  int32_t compress_ratio = 1;
  bool ue8m0 = true;
  int32_t num_heads = 8;
  int32_t topk = 16;
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

  // Inputs of every layer for a step over `seqs` (nothing recorded yet).
  std::vector<LayerData> Make(const std::vector<SeqStep>& seqs) {
    std::vector<LayerData> out;
    for (const TestLayer& t : layers_) out.push_back(MakeLayer(t, seqs));
    return out;
  }

  // Records a committed step's new entries.
  void Commit(const std::vector<SeqStep>& seqs, const std::vector<LayerData>& data) {
    for (size_t li = 0; li < layers_.size(); ++li) {
      const TestLayer& t = layers_[li];
      const int eb = t.layout.entry_bytes();
      int64_t k = 0;
      for (const auto& [s, q_len] : seqs) {
        const int64_t n = (len(s) + q_len) / t.compress_ratio - len(s) / t.compress_ratio;
        auto& e = entries_[{t.layer, s}];
        e.insert(e.end(), data[li].k_quant.begin() + k * eb,
                 data[li].k_quant.begin() + (k + n) * eb);
        k += n;
      }
    }
    for (const auto& [s, q_len] : seqs) len_[s] += q_len;
  }

  // Checks the top-k of layer index `li` of a step over `seqs`, whose new
  // entries are data[li] (not yet committed).
  void Check(size_t li, const std::vector<SeqStep>& seqs, const LayerData& d,
             const int32_t* topk) const {
    const TestLayer& t = layers_[li];
    const PageLayout& L = t.layout;
    const int eb = L.entry_bytes(), vb = L.value_bytes(), sb = L.head_dim / 32;
    int64_t row = 0, k = 0;
    for (const auto& [s, q_len] : seqs) {
      std::vector<uint8_t> all;
      auto it = entries_.find({t.layer, s});
      if (it != entries_.end()) all = it->second;
      const int64_t old = len(s);
      const int64_t n = (old + q_len) / t.compress_ratio - old / t.compress_ratio;
      all.insert(all.end(), d.k_quant.begin() + k * eb, d.k_quant.begin() + (k + n) * eb);
      k += n;
      std::vector<RefEntry> decoded;
      for (size_t e = 0; e * eb < all.size(); ++e) decoded.push_back(DecodeEntry(L, &all[e * eb]));
      for (int64_t j = 0; j < q_len; ++j, ++row) {
        const int64_t p = old + j;
        const int64_t visible = (p + 1) / t.compress_ratio;
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
        ExpectTopkRow(logits, topk + row * t.topk, t.topk,
                      "layer " + std::to_string(t.layer) + " seq " + s + " row " +
                          std::to_string(row) + " (position " + std::to_string(p) + ")");
      }
    }
  }

 private:
  LayerData MakeLayer(const TestLayer& t, const std::vector<SeqStep>& seqs) {
    const PageLayout& L = t.layout;
    const int D = L.head_dim, H = t.num_heads, vb = L.value_bytes(), eb = L.entry_bytes();
    LayerData d;
    for (const auto& [s, q_len] : seqs) {
      d.n_new += (len(s) + q_len) / t.compress_ratio - len(s) / t.compress_ratio;
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
        const float s = QuantizeFp8Entry(&d.k_float[e * D], D, t.ue8m0, out);
        memcpy(out + vb, &s, 4);
      } else {
        QuantizeMxfp4(&d.k_float[e * D], D, out, out + vb);
      }
    }
    d.q_float.resize(d.rows * H * D);
    for (float& x : d.q_float) x = normal(rng_);
    d.weights.resize(d.rows * H);
    for (float& w : d.weights) w = normal(rng_);  // negative weights too
    d.w_folded = d.weights;
    d.q_codes.resize(d.rows * H * vb);
    d.q_scales.resize(d.rows * H * (D / 32));
    for (int64_t rh = 0; rh < d.rows * H; ++rh) {
      if (L.format == KvFormat::kFp8) {
        d.w_folded[rh] *= QuantizeFp8Q(&d.q_float[rh * D], D, &d.q_codes[rh * vb]);
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
};

}  // namespace indexer::testing

#include "client/workload.h"

#include <cmath>

#include "indexer/client.h"

namespace indexer::client {

namespace {

uint64_t SplitMix64(uint64_t& x) {
  uint64_t z = (x += 0x9e3779b97f4a7c15ULL);
  z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ULL;
  z = (z ^ (z >> 27)) * 0x94d049bb133111ebULL;
  return z ^ (z >> 31);
}

uint64_t Rotl(uint64_t x, int k) { return (x << k) | (x >> (64 - k)); }

}  // namespace

Rng::Rng(uint64_t seed) {
  for (uint64_t& s : s_) s = SplitMix64(seed);
}

uint64_t Rng::Next() {
  const uint64_t result = Rotl(s_[1] * 5, 7) * 9;
  const uint64_t t = s_[1] << 17;
  s_[2] ^= s_[0];
  s_[3] ^= s_[1];
  s_[1] ^= s_[2];
  s_[0] ^= s_[3];
  s_[2] ^= t;
  s_[3] = Rotl(s_[3], 45);
  return result;
}

float Rng::Uniform() {
  return static_cast<float>(Next() >> 40) * 0x1.0p-24f;  // 24 random bits
}

float Rng::Normal() {
  if (has_spare_) {
    has_spare_ = false;
    return spare_;
  }
  // u1 in (0, 1] keeps the log finite.
  const float u1 = 1.0f - Uniform();
  const float u2 = Uniform();
  const float radius = std::sqrt(-2.0f * std::log(u1));
  const float angle = 6.28318530717958647692f * u2;
  spare_ = radius * std::sin(angle);
  has_spare_ = true;
  return radius * std::cos(angle);
}

void Rng::FillNormal(absl::Span<float> out) {
  for (float& x : out) x = Normal();
}

std::vector<float> RandomWeights(Rng& rng, const LayerSpec& spec,
                                 int64_t rows) {
  const float model_scale =
      1.0f / std::sqrt(static_cast<float>(spec.head_dim) * spec.num_heads);
  std::vector<float> w(static_cast<size_t>(rows) * spec.num_heads);
  for (float& x : w) x = (0.5f + rng.Uniform()) * model_scale;
  return w;
}

v1::Tensor MakeKTensor(const LayerSpec& spec, absl::Span<const float> raw,
                       absl::Span<const uint8_t> quantized,
                       bool prequantized) {
  if (prequantized) {
    const int64_t n = static_cast<int64_t>(quantized.size()) /
                      spec.entry_bytes();
    return MakeByteTensor(v1::UINT8, quantized, {n, spec.entry_bytes()});
  }
  const int64_t n = static_cast<int64_t>(raw.size()) / spec.head_dim;
  return MakeFp32Tensor(raw, {n, spec.head_dim});
}

void SetQueries(const LayerSpec& spec, const QuantizedQ& q,
                absl::Span<const float> raw_q,
                absl::Span<const float> raw_weights, bool q_fp32,
                v1::LayerRequest* request) {
  const int64_t rows = q.rows;
  const int64_t h = spec.num_heads;
  const int64_t d = spec.head_dim;
  if (q_fp32) {
    *request->mutable_q() = MakeFp32Tensor(raw_q, {rows, h, d});
    *request->mutable_weights() = MakeFp32Tensor(raw_weights, {rows, h});
    return;
  }
  if (spec.format == KvFormat::kFp8) {
    *request->mutable_q() = MakeByteTensor(v1::FP8_E4M3, q.values,
                                           {rows, h, d});
  } else {
    *request->mutable_q() = MakeByteTensor(v1::UINT8, q.values,
                                           {rows, h, d / 2});
    *request->mutable_q_scale() = MakeByteTensor(v1::UINT8, q.scales,
                                                 {rows, h, d / kMxBlock});
  }
  *request->mutable_weights() = MakeFp32Tensor(q.weights, {rows, h});
}

int64_t LayerRequestBytes(const LayerSpec& spec, int64_t rows,
                          int64_t new_entries, bool q_fp32,
                          bool prequantized) {
  const int64_t h = spec.num_heads;
  const int64_t d = spec.head_dim;
  const int64_t k_bytes =
      new_entries * (prequantized ? spec.entry_bytes() : d * 4);
  const int64_t q_bytes =
      rows * h *
      (q_fp32 ? d * 4 : spec.value_bytes() + (spec.format == KvFormat::kFp8
                                                  ? 0
                                                  : d / kMxBlock));
  return k_bytes + q_bytes + rows * h * 4;
}

}  // namespace indexer::client

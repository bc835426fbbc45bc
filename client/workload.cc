#include "client/workload.h"

#include <algorithm>
#include <cmath>

#include "absl/strings/str_cat.h"
#include "indexer/client.h"
#include "kernels/format/fp8.h"
#include "kernels/format/numeric.h"

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

absl::StatusOr<BlockQFormat> ParseBlockQFormat(absl::string_view name) {
  if (name == "fp32") return BlockQFormat::kFp32;
  if (name == "bf16") return BlockQFormat::kBf16;
  if (name == "fp8") return BlockQFormat::kFp8;
  return absl::InvalidArgumentError(absl::StrCat(
      "--block-q: expected fp32, bf16 or fp8, got '", name, "'"));
}

const char* BlockQFormatName(BlockQFormat format) {
  switch (format) {
    case BlockQFormat::kFp32: return "FP32";
    case BlockQFormat::kBf16: return "BF16";
    case BlockQFormat::kFp8: return "FP8_E4M3";
  }
  return "?";
}

namespace {

// bf16 bits of a finite float, round to nearest even.
uint16_t FloatToBf16(float x) {
  const uint32_t bits = FloatToBits(x);
  const uint32_t rounding = 0x7fffu + ((bits >> 16) & 1u);
  return static_cast<uint16_t>((bits + rounding) >> 16);
}

}  // namespace

std::vector<float> SetBlockQueries(const LayerSpec& spec, int32_t rows,
                                   absl::Span<const float> raw_q,
                                   BlockQFormat format,
                                   v1::LayerRequest* request) {
  const int64_t h = spec.num_heads;
  const int64_t d = spec.head_dim;
  request->clear_weights();
  request->clear_q_scale();
  std::vector<float> seen(raw_q.begin(), raw_q.end());
  switch (format) {
    case BlockQFormat::kFp32:
      *request->mutable_q() = MakeFp32Tensor(raw_q, {rows, h, d});
      break;
    case BlockQFormat::kBf16: {
      std::vector<uint16_t> bf16(raw_q.size());
      for (size_t i = 0; i < raw_q.size(); ++i) {
        bf16[i] = FloatToBf16(raw_q[i]);
        seen[i] = Bf16ToFloat(bf16[i]);
      }
      std::vector<int64_t> shape = {rows, h, d};
      *request->mutable_q() = MakeTensor(v1::BF16, shape, bf16.data(),
                                         bf16.size() * sizeof(uint16_t));
      break;
    }
    case BlockQFormat::kFp8: {
      std::vector<uint8_t> codes(raw_q.size());
      std::vector<float> scales(static_cast<size_t>(rows) * h);
      for (size_t rh = 0; rh < scales.size(); ++rh) {
        scales[rh] = QuantizeFp8Q(raw_q.data() + rh * d, static_cast<int>(d),
                                  codes.data() + rh * d);
        for (int64_t i = 0; i < d; ++i) {
          seen[rh * d + i] = DecodeE4m3(codes[rh * d + i]) * scales[rh];
        }
      }
      *request->mutable_q() = MakeByteTensor(v1::FP8_E4M3, codes, {rows, h, d});
      *request->mutable_q_scale() = MakeFp32Tensor(scales, {rows, h});
      break;
    }
  }
  return seen;
}

int64_t ReplyBytesPerRow(const LayerSpec& spec) {
  return 4 * NumElements(spec.ReplyShape(1));
}

int64_t ImportChunkTokens(const std::vector<LayerSpec>& specs,
                          int64_t max_q_len, int64_t budget_bytes) {
  int64_t bytes_per_token = 1;
  for (const LayerSpec& spec : specs) {
    bytes_per_token += spec.entry_bytes() / spec.compress_ratio + 1;
  }
  return std::clamp<int64_t>(budget_bytes / bytes_per_token, 1,
                             std::max<int64_t>(max_q_len, 1));
}

int64_t LayerRequestBytes(const LayerSpec& spec, int64_t rows,
                          int64_t new_entries, bool q_fp32, bool prequantized,
                          BlockQFormat block_q) {
  const int64_t h = spec.num_heads;
  const int64_t d = spec.head_dim;
  const int64_t k_bytes =
      new_entries * (prequantized ? spec.entry_bytes() : d * 4);
  if (spec.is_block()) {
    const int64_t per_value = block_q == BlockQFormat::kFp32   ? 4
                              : block_q == BlockQFormat::kBf16 ? 2
                                                               : 1;
    return k_bytes + rows * h * d * per_value +
           (block_q == BlockQFormat::kFp8 ? rows * h * 4 : 0);
  }
  const int64_t q_bytes =
      rows * h *
      (q_fp32 ? d * 4 : spec.value_bytes() + (spec.format == KvFormat::kFp8
                                                  ? 0
                                                  : d / kMxBlock));
  return k_bytes + q_bytes + rows * h * 4;
}

}  // namespace indexer::client

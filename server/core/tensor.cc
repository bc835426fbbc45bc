#include "server/core/tensor.h"

#include <algorithm>
#include <cstring>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "kernels/format/numeric.h"

namespace indexer {

const char* DTypeName(DType d) {
  switch (d) {
    case DType::kFp32: return "FP32";
    case DType::kBf16: return "BF16";
    case DType::kFp16: return "FP16";
    case DType::kInt32: return "INT32";
    case DType::kUint8: return "UINT8";
    case DType::kFp8E4m3: return "FP8_E4M3";
    default: return "UNSPECIFIED";
  }
}

int DTypeSize(DType d) {
  switch (d) {
    case DType::kFp32:
    case DType::kInt32: return 4;
    case DType::kBf16:
    case DType::kFp16: return 2;
    case DType::kUint8:
    case DType::kFp8E4m3: return 1;
    default: return 0;
  }
}

int64_t TensorView::NumElements() const {
  int64_t n = 1;
  for (int64_t d : shape) n *= d;
  return n;
}

std::string TensorView::ShapeString() const {
  return absl::StrCat("[", absl::StrJoin(shape, ", "), "]");
}

absl::Status ExpectTensor(absl::string_view field, const TensorView& t,
                          DType dtype, std::initializer_list<int64_t> shape) {
  const int64_t want_bytes = [&] {
    int64_t n = DTypeSize(dtype);
    for (int64_t d : shape) n *= d;
    return n;
  }();
  auto describe = [](absl::Span<const int64_t> s, DType d, int64_t bytes) {
    return absl::StrCat("[", absl::StrJoin(s, ", "), "] ", DTypeName(d), " (",
                        bytes, " bytes)");
  };
  const std::string want =
      describe(absl::MakeConstSpan(shape.begin(), shape.size()), dtype, want_bytes);
  if (!t.present) {
    return absl::InvalidArgumentError(
        absl::StrCat(field, ": expected ", want, ", got nothing"));
  }
  for (int64_t d : t.shape) {
    if (d < 0) {
      return absl::InvalidArgumentError(absl::StrCat(
          field, ": expected ", want, ", got negative dimension in ",
          t.ShapeString()));
    }
  }
  const bool same_shape =
      t.shape.size() == shape.size() &&
      std::equal(t.shape.begin(), t.shape.end(), shape.begin());
  if (t.dtype != dtype || !same_shape ||
      static_cast<int64_t>(t.data.size()) != want_bytes) {
    return absl::InvalidArgumentError(absl::StrCat(
        field, ": expected ", want, ", got ",
        describe(t.shape, t.dtype, static_cast<int64_t>(t.data.size()))));
  }
  return absl::OkStatus();
}

namespace {

// Index of the first element whose `mask` bits are all set (an all-ones
// exponent: Inf or NaN; for e4m3fn the NaN codes), or -1. This runs on every
// Q tensor (0.5 MB per decode layer), so it scans 64-bit words: per lane,
// z = ~x & mask is 0 exactly when all mask bits are set, and z + mask then
// lacks the bit just above the (contiguous) mask, with no carry into the
// next lane. Only a block with a hit is searched element by element.
template <typename T>
int64_t FirstAllOnes(const char* data, int64_t n, T mask) {
  static_assert(8 % sizeof(T) == 0, "lanes tile a 64-bit word");
  constexpr int kLanes = 8 / sizeof(T);
  uint64_t lanes_mask = 0, lanes_top = 0;
  const uint64_t top = static_cast<uint64_t>(mask) + (mask & (~mask + 1));  // bit above the mask
  for (int l = 0; l < kLanes; ++l) {
    lanes_mask |= static_cast<uint64_t>(mask) << (8 * sizeof(T) * l);
    lanes_top |= top << (8 * sizeof(T) * l);
  }
  auto element = [data](int64_t i) {
    T v;
    memcpy(&v, data + i * static_cast<int64_t>(sizeof(T)), sizeof(T));
    return v;
  };
  constexpr int64_t kBlock = 4096;  // elements
  for (int64_t b = 0; b < n; b += kBlock) {
    const int64_t m = std::min(kBlock, n - b);
    const int64_t words = m / kLanes;
    uint64_t all = lanes_top;
    for (int64_t w = 0; w < words; ++w) {
      uint64_t x;
      memcpy(&x, data + (b + w * kLanes) * static_cast<int64_t>(sizeof(T)), 8);
      all &= (~x & lanes_mask) + lanes_mask;
    }
    bool hit = all != lanes_top;
    for (int64_t i = words * kLanes; i < m && !hit; ++i) hit = (element(b + i) & mask) == mask;
    if (!hit) continue;
    for (int64_t i = 0; i < m; ++i) {
      if ((element(b + i) & mask) == mask) return b + i;
    }
  }
  return -1;
}

}  // namespace

absl::Status CheckTensorFinite(absl::string_view field, const TensorView& t) {
  const int size = DTypeSize(t.dtype);
  if (size == 0) return absl::OkStatus();
  const int64_t n = static_cast<int64_t>(t.data.size()) / size;
  int64_t bad = -1;
  switch (t.dtype) {
    case DType::kFp32:
      bad = FirstAllOnes<uint32_t>(t.data.data(), n, 0x7f800000u);
      break;
    case DType::kBf16:
      bad = FirstAllOnes<uint16_t>(t.data.data(), n, 0x7f80u);
      break;
    case DType::kFp8E4m3:
      bad = FirstAllOnes<uint8_t>(t.data.data(), n, 0x7fu);
      break;
    default:
      return absl::OkStatus();
  }
  if (bad >= 0) {
    return absl::InvalidArgumentError(absl::StrCat(
        field, ": element ", bad, " is NaN or Inf; expected finite values"));
  }
  return absl::OkStatus();
}

}  // namespace indexer

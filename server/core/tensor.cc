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
    case DType::kFp8E4m3fnuz: return "FP8_E4M3FNUZ";
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
    case DType::kFp8E4m3:
    case DType::kFp8E4m3fnuz: return 1;
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
      t.ByteSize() != want_bytes) {
    return absl::InvalidArgumentError(absl::StrCat(
        field, ": expected ", want, ", got ",
        describe(t.shape, t.dtype, t.ByteSize())));
  }
  return absl::OkStatus();
}

namespace {

// Index of the first element whose `mask` bits are all set (an all-ones
// exponent: Inf or NaN; for e4m3fn the NaN codes), or -1. This runs on every
// Q tensor (0.5 MB per decode layer), so it compares 64-byte vectors (GCC /
// Clang vector extensions: SSE2 on any x86-64, AVX2 / AVX-512 through the
// target clones below) and ORs the lane results over blocks of 4096
// elements; only a block with a hit is searched element by element.
template <typename T>
inline int64_t FirstAllOnes(const char* data, int64_t n, T mask) {
  typedef T V __attribute__((vector_size(64)));
  constexpr int64_t kLanes = 64 / sizeof(T);
  auto element = [data](int64_t i) {
    T v;
    memcpy(&v, data + i * static_cast<int64_t>(sizeof(T)), sizeof(T));
    return v;
  };
  constexpr int64_t kBlock = 4096;  // elements, a multiple of kLanes
  for (int64_t b = 0; b < n; b += kBlock) {
    const int64_t m = std::min(kBlock, n - b);
    const int64_t vecs = m / kLanes;
    const char* p = data + b * static_cast<int64_t>(sizeof(T));
    V acc = {};
    for (int64_t v = 0; v < vecs; ++v) {
      V x;
      memcpy(&x, p + v * 64, 64);
      acc |= reinterpret_cast<V>((x & mask) == mask);
    }
    bool hit = false;
    for (int64_t l = 0; l < kLanes; ++l) hit |= acc[l] != 0;
    for (int64_t i = vecs * kLanes; i < m && !hit; ++i) hit = (element(b + i) & mask) == mask;
    if (!hit) continue;
    for (int64_t i = 0; i < m; ++i) {
      if ((element(b + i) & mask) == mask) return b + i;
    }
  }
  return -1;
}

#if defined(__x86_64__) && defined(__GNUC__) && !defined(__clang__)
#define INDEXER_SIMD_CLONES __attribute__((target_clones("arch=x86-64-v4", "avx2", "default")))
#else
#define INDEXER_SIMD_CLONES
#endif

INDEXER_SIMD_CLONES int64_t FirstNonFiniteFp32(const char* data, int64_t n) {
  return FirstAllOnes<uint32_t>(data, n, 0x7f800000u);
}
INDEXER_SIMD_CLONES int64_t FirstNonFiniteBf16(const char* data, int64_t n) {
  return FirstAllOnes<uint16_t>(data, n, 0x7f80u);
}
INDEXER_SIMD_CLONES int64_t FirstNanE4m3(const char* data, int64_t n) {
  return FirstAllOnes<uint8_t>(data, n, 0x7fu);
}

}  // namespace

absl::Status CheckTensorFinite(absl::string_view field, const TensorView& t) {
  const int size = DTypeSize(t.dtype);
  if (size == 0) return absl::OkStatus();
  const int64_t n = static_cast<int64_t>(t.data.size()) / size;
  int64_t bad = -1;
  switch (t.dtype) {
    case DType::kFp32:
      bad = FirstNonFiniteFp32(t.data.data(), n);
      break;
    case DType::kBf16:
      bad = FirstNonFiniteBf16(t.data.data(), n);
      break;
    case DType::kFp8E4m3:
      bad = FirstNanE4m3(t.data.data(), n);
      break;
    case DType::kFp8E4m3fnuz:  // one NaN code, 0x80
      for (int64_t i = 0; i < n && bad < 0; ++i) {
        if (static_cast<uint8_t>(t.data[static_cast<size_t>(i)]) == 0x80) bad = i;
      }
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

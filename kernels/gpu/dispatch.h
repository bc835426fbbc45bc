// The one place where runtime sizes become template constants. Each helper
// calls `fn` with a std::integral_constant for a supported value; any other
// value returns an error status naming the field and the supported values.
#pragma once

#include <cstdint>
#include <type_traits>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "kernels/format/page_layout.h"

namespace indexer {
namespace gpu {

template <class F>
absl::Status DispatchFormat(KvFormat format, F&& fn) {
  switch (format) {
    case KvFormat::kFp8:
      return fn(std::integral_constant<KvFormat, KvFormat::kFp8>{});
    case KvFormat::kMxfp4:
      return fn(std::integral_constant<KvFormat, KvFormat::kMxfp4>{});
  }
  return absl::InvalidArgumentError(absl::StrCat(
      "format: expected FP8 or MXFP4, got ", static_cast<int>(format)));
}

// Head counts the tensor-core logits kernels are instantiated for (one, to
// keep CI compile time down: the DeepSeek indexer has H = 64).
template <class F>
absl::Status DispatchMmaHeads(int32_t heads, F&& fn) {
  switch (heads) {
    case 64:
      return fn(std::integral_constant<int, 64>{});
    default:
      return absl::UnimplementedError(absl::StrCat(
          "num_heads: tensor-core logits are built for 64, got ", heads));
  }
}

// Rows of one group the wgmma logits kernel multiplies at once (N = 64 x).
template <class F>
absl::Status DispatchWgmmaRows(int32_t rows, F&& fn) {
  switch (rows) {
    case 1:
      return fn(std::integral_constant<int, 1>{});
    case 2:
      return fn(std::integral_constant<int, 2>{});
    case 4:
      return fn(std::integral_constant<int, 4>{});
    default:
      return absl::InvalidArgumentError(absl::StrCat(
          "group rows: the wgmma logits kernel takes 1, 2 or 4, got ", rows));
  }
}

inline bool MmaHeadsSupported(int32_t heads) { return heads == 64; }

}  // namespace gpu
}  // namespace indexer

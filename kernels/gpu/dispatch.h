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

// Head counts the tensor-core logits kernels are instantiated for: the
// DeepSeek V3.2 indexer's 64, V4.1's 32 and 16 (a V4.1 indexer split over
// two ranks). The kernels take H as a template constant (wgmma N = rows x H,
// mma.sync N tiles of 8 heads); any other H runs the portable kernel.
template <class F>
absl::Status DispatchMmaHeads(int32_t heads, F&& fn) {
  switch (heads) {
    case 64:
      return fn(std::integral_constant<int, 64>{});
    case 32:
      return fn(std::integral_constant<int, 32>{});
    case 16:
      return fn(std::integral_constant<int, 16>{});
    default:
      return absl::UnimplementedError(absl::StrCat(
          "num_heads: tensor-core logits are built for 16, 32 and 64, got ", heads));
  }
}

// Rows of one group the wgmma logits kernel multiplies at once (N = H x).
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

inline bool MmaHeadsSupported(int32_t heads) { return heads == 64 || heads == 32 || heads == 16; }

}  // namespace gpu
}  // namespace indexer

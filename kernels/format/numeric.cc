#include "kernels/format/numeric.h"

#include <cmath>

#include "absl/strings/str_cat.h"
#include "kernels/format/fp8.h"

namespace indexer {

float Pow2(int e) { return format_internal::ExactPow2(e); }

absl::Status CheckFinite(const float* x, int64_t n, absl::string_view field) {
  for (int64_t i = 0; i < n; ++i) {
    if (!std::isfinite(x[i])) {
      return absl::InvalidArgumentError(
          absl::StrCat(field, ": expected finite values, got ", x[i],
                       " at element ", i));
    }
  }
  return absl::OkStatus();
}

}  // namespace indexer

// Validation and conversion of one layer's inputs (SPEC §3, §6). Errors name
// the field and the expected shape, dtype and byte count.
#pragma once

#include <cstdint>
#include <vector>

#include "absl/status/statusor.h"
#include "kernels/backend.h"
#include "server/core/model.h"
#include "server/core/tensor.h"

namespace indexer {

// The new entries of a layer: [n_new, D] FP32/BF16, or [n_new, VB + SB]
// UINT8 linear entries whose FP8 codes and scales are finite (scale > 0) and
// whose e8m0 scales are not NaN (0xff). FP8 entries whose codes are of the
// other variant than the cache's (k.fp8_codes) are converted into
// `converted` (SPEC §3, ConvertFp8Code) and the result points there; device
// entries must already be in the cache's variant.
absl::StatusOr<KInput> ValidateK(const GroupSpec& g, int64_t n_new,
                                 const TensorView& k, std::vector<uint8_t>* converted);

// The DType of the FP8 codes an fp8 cache holds: FP8_E4M3 or FP8_E4M3FNUZ.
DType CacheFp8DType(const PageLayout& layout);

// Buffers reused from layer to layer of a step.
struct QScratch {
  std::vector<uint8_t> values;
  std::vector<uint8_t> scales;
  std::vector<float> weights;
};

// True when q, q_scale and weights are device tensors the backend takes
// as they are: Q in the cache's FP8 dtype (fp8 layers; the other variant is
// converted on the host path) or UINT8 packed Q with UINT8 q_scale
// (mxfp4 layers), and FP32 weights, all on the device. Other device inputs
// are copied to the host first and take the host path.
bool DeviceQReady(const GroupSpec& g, const TensorView& q, const TensorView& q_scale,
                  const TensorView& weights);

// Validates q / q_scale / weights for `rows` rows and returns them in the
// group's K format: FP8 layers take FP8_E4M3 / FP8_E4M3FNUZ Q (codes of the
// other variant than the cache's converted, the conversion's scale folded
// into the weight) or FP32/BF16 Q (quantized per (row, head) in the cache's
// variant, the power-of-two scale folded into the weight); MXFP4 layers
// take UINT8 packed Q with UINT8 q_scale, or FP32/BF16 Q (quantized per
// 32-element block). The returned pointers point into `in` or `scratch`.
// With device tensors (REQUIRES: DeviceQReady) only shapes, dtypes and byte
// counts are checked here and the result points at device memory.
absl::StatusOr<QInput> PrepareQ(const GroupSpec& g, int32_t rows,
                                const TensorView& q, const TensorView& q_scale,
                                const TensorView& weights, QScratch* scratch);

// Block layers: q [rows, Hi, D] FP32, BF16, FP8_E4M3 or FP8_E4M3FNUZ (with
// an optional [rows, Hi] FP32 q_scale for FP8), widened to fp32 into `out`; weights
// must be unset.
absl::StatusOr<BlockQInput> PrepareBlockQ(const GroupSpec& g, int32_t rows,
                                          const TensorView& q,
                                          const TensorView& q_scale,
                                          const TensorView& weights,
                                          std::vector<float>* out);

}  // namespace indexer

// A borrowed view of a wire tensor and the checks every input goes through.
// The core never sees protobuf messages of the wire API; the rpc layer wraps
// their bytes in TensorView without copying.
#pragma once

#include <cstdint>
#include <initializer_list>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/strings/string_view.h"

namespace indexer {

// Mirrors indexer.v1.DataType (same numbering).
enum class DType : int32_t {
  kUnspecified = 0,
  kFp32 = 1,
  kBf16 = 2,
  kFp16 = 3,
  kInt32 = 4,
  kUint8 = 5,
  kFp8E4m3 = 6,
};

const char* DTypeName(DType d);
int DTypeSize(DType d);  // bytes per element; 0 for kUnspecified

struct TensorView {
  DType dtype = DType::kUnspecified;
  std::vector<int64_t> shape;
  absl::string_view data;  // borrowed; lives as long as the request
  bool present = false;    // false when the field was not set
  // PLACEHOLDER(regions): `data` then spans device memory (a device region)
  // and must not be dereferenced on the host. The `plane` branch brings the
  // real device-tensor flag and its handling; until then the engine refuses
  // such tensors (FAILED_PRECONDITION "device regions: ... not wired yet").
  bool on_device = false;

  int64_t NumElements() const;
  std::string ShapeString() const;
};

// OK when `t` has dtype `dtype` and exactly `shape` with matching byte count,
// else INVALID_ARGUMENT of the form
//   "q: expected [12, 64, 128] FP8_E4M3 (98304 bytes), got [12, 64, 128] FP8_E4M3 (98300 bytes)".
absl::Status ExpectTensor(absl::string_view field, const TensorView& t,
                          DType dtype, std::initializer_list<int64_t> shape);

// INVALID_ARGUMENT naming `field` and the first element that is NaN or Inf.
// `t` is FP32, BF16 or FP8_E4M3 (e4m3fn has NaN codes only).
absl::Status CheckTensorFinite(absl::string_view field, const TensorView& t);

}  // namespace indexer

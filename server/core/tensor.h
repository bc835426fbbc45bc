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
  kFp8E4m3 = 6,      // e4m3fn codes
  kFp8E4m3fnuz = 7,  // e4m3fnuz codes (SPEC §3)
};

const char* DTypeName(DType d);
int DTypeSize(DType d);  // bytes per element; 0 for kUnspecified

struct TensorView {
  DType dtype = DType::kUnspecified;
  std::vector<int64_t> shape;
  absl::string_view data;  // borrowed; lives as long as the request
  bool present = false;    // false when the field was not set
  // A UINT8 pre-quantized K: the FP8 dtype of the codes in its entries
  // (LayerRequest / LayerEntries k_fp8); kUnspecified reads as kFp8E4m3.
  DType fp8_codes = DType::kUnspecified;
  // Memory space: with on_device the bytes are `device_bytes` bytes at
  // `device_ptr` in the daemon device's memory (a device region) and `data`
  // is empty. The core never dereferences device_ptr: it checks shape, dtype
  // and byte count as usual and hands the pointer to the backend.
  bool on_device = false;
  const void* device_ptr = nullptr;
  int64_t device_bytes = 0;

  int64_t NumElements() const;
  // Bytes of the tensor in whichever memory holds it.
  int64_t ByteSize() const {
    return on_device ? device_bytes : static_cast<int64_t>(data.size());
  }
  // The tensor's bytes as the backend takes them (device or host address).
  const void* Bytes() const { return on_device ? device_ptr : data.data(); }
  std::string ShapeString() const;
};

// OK when `t` has dtype `dtype` and exactly `shape` with matching byte count,
// else INVALID_ARGUMENT of the form
//   "q: expected [12, 64, 128] FP8_E4M3 (98304 bytes), got [12, 64, 128] FP8_E4M3 (98300 bytes)".
absl::Status ExpectTensor(absl::string_view field, const TensorView& t,
                          DType dtype, std::initializer_list<int64_t> shape);

// INVALID_ARGUMENT naming `field` and the first element that is NaN or Inf.
// `t` is FP32, BF16, FP8_E4M3 or FP8_E4M3FNUZ (FP8 has NaN codes only:
// 0x7f / 0xff in e4m3fn, 0x80 in e4m3fnuz). REQUIRES: a
// host tensor (device tensors are checked by the backend, on the device).
absl::Status CheckTensorFinite(absl::string_view field, const TensorView& t);

}  // namespace indexer

#include "server/core/layer_inputs.h"

#include <cmath>
#include <cstring>

#include "absl/strings/str_cat.h"
#include "kernels/common/status_macros.h"
#include "kernels/format/fp8.h"
#include "kernels/format/mxfp4.h"
#include "kernels/format/numeric.h"

namespace indexer {
namespace {

// Reads element i of an FP32 or BF16 tensor.
float FloatAt(const TensorView& t, int64_t i) {
  if (t.dtype == DType::kFp32) {
    float f;
    memcpy(&f, t.data.data() + 4 * i, 4);
    return f;
  }
  uint16_t h;
  memcpy(&h, t.data.data() + 2 * i, 2);
  return Bf16ToFloat(h);
}

absl::Status CheckScaleBytes(absl::string_view field, absl::string_view bytes) {
  for (size_t i = 0; i < bytes.size(); ++i) {
    if (static_cast<uint8_t>(bytes[i]) == 0xff) {
      return absl::InvalidArgumentError(absl::StrCat(
          field, ": scale byte ", i, " is 0xff (e8m0 NaN); expected 0x00..0xfe"));
    }
  }
  return absl::OkStatus();
}

}  // namespace

absl::StatusOr<KInput> ValidateK(const GroupSpec& g, int64_t n_new,
                                 const TensorView& k) {
  const PageLayout& L = g.layout;
  KInput out;
  out.ue8m0 = g.ue8m0;
  if (k.on_device) {
    // Shape, dtype and bytes here; the values are checked by the backend on
    // the device (finite floats; e4m3 NaN codes and scales of entries).
    if (k.dtype == DType::kUint8) {
      RETURN_IF_ERROR(ExpectTensor("k", k, DType::kUint8, {n_new, L.entry_bytes()}));
      out.kind = KInput::Kind::kQuantized;
    } else if (k.dtype == DType::kFp32 || k.dtype == DType::kBf16) {
      RETURN_IF_ERROR(ExpectTensor("k", k, k.dtype, {n_new, L.head_dim}));
      out.kind = k.dtype == DType::kFp32 ? KInput::Kind::kFloat32 : KInput::Kind::kBf16;
    } else {
      return absl::InvalidArgumentError(absl::StrCat(
          "k: expected FP32 or BF16 [", n_new, ", ", L.head_dim, "] or UINT8 [", n_new, ", ",
          L.entry_bytes(), "] entries, got ", DTypeName(k.dtype), " ", k.ShapeString()));
    }
    out.data = k.device_ptr;
    out.on_device = true;
    return out;
  }
  if (k.dtype == DType::kUint8) {
    RETURN_IF_ERROR(ExpectTensor("k", k, DType::kUint8, {n_new, L.entry_bytes()}));
    const auto* p = reinterpret_cast<const uint8_t*>(k.data.data());
    for (int64_t e = 0; e < n_new; ++e) {
      const uint8_t* entry = p + e * L.entry_bytes();
      if (L.format == KvFormat::kFp8) {
        for (int32_t b = 0; b < L.value_bytes(); ++b) {
          if ((entry[b] & 0x7f) == 0x7f) {
            return absl::InvalidArgumentError(absl::StrCat(
                "k: entry ", e, " value ", b, " is an e4m3 NaN code; expected finite"));
          }
        }
        float s;
        memcpy(&s, entry + L.value_bytes(), 4);
        if (!std::isfinite(s) || !(s > 0)) {
          return absl::InvalidArgumentError(absl::StrCat(
              "k: entry ", e, " scale is ", s, "; expected a finite value > 0"));
        }
      } else {
        RETURN_IF_ERROR(CheckScaleBytes(
            absl::StrCat("k: entry ", e),
            absl::string_view(reinterpret_cast<const char*>(entry + L.value_bytes()),
                              L.scale_bytes())));
      }
    }
    out.kind = KInput::Kind::kQuantized;
  } else if (k.dtype == DType::kFp32 || k.dtype == DType::kBf16) {
    RETURN_IF_ERROR(ExpectTensor("k", k, k.dtype, {n_new, L.head_dim}));
    RETURN_IF_ERROR(CheckTensorFinite("k", k));
    out.kind = k.dtype == DType::kFp32 ? KInput::Kind::kFloat32 : KInput::Kind::kBf16;
  } else {
    return absl::InvalidArgumentError(absl::StrCat(
        "k: expected FP32 or BF16 [", n_new, ", ", L.head_dim, "] or UINT8 [", n_new,
        ", ", L.entry_bytes(), "] entries, got ", DTypeName(k.dtype), " ",
        k.ShapeString()));
  }
  out.data = k.data.data();
  return out;
}

absl::StatusOr<QInput> PrepareQ(const GroupSpec& g, int32_t rows,
                                const TensorView& q, const TensorView& q_scale,
                                const TensorView& weights, QScratch* scratch) {
  const PageLayout& L = g.layout;
  const int64_t H = g.num_heads, D = L.head_dim;
  if (q.on_device || q_scale.on_device || weights.on_device) {
    // Only the forms the backend takes as they are come here (DeviceQReady);
    // the caller copied any other form to the host first.
    QInput out;
    out.num_heads = g.num_heads;
    out.on_device = true;
    RETURN_IF_ERROR(ExpectTensor("weights", weights, DType::kFp32, {rows, H}));
    out.weights = static_cast<const float*>(weights.device_ptr);
    if (L.format == KvFormat::kFp8) {
      RETURN_IF_ERROR(ExpectTensor("q", q, DType::kFp8E4m3, {rows, H, D}));
      if (q_scale.present) {
        return absl::InvalidArgumentError(
            "q_scale: expected unset for an fp8 layer (fold Q scales into weights)");
      }
    } else {
      RETURN_IF_ERROR(ExpectTensor("q", q, DType::kUint8, {rows, H, D / 2}));
      RETURN_IF_ERROR(ExpectTensor("q_scale", q_scale, DType::kUint8, {rows, H, D / kMxBlock}));
      out.scales = static_cast<const uint8_t*>(q_scale.device_ptr);
    }
    out.values = static_cast<const uint8_t*>(q.device_ptr);
    return out;
  }
  RETURN_IF_ERROR(ExpectTensor("weights", weights, DType::kFp32, {rows, H}));
  RETURN_IF_ERROR(CheckTensorFinite("weights", weights));
  QInput out;
  out.num_heads = g.num_heads;
  out.weights = reinterpret_cast<const float*>(weights.data.data());

  const bool from_float = q.dtype == DType::kFp32 || q.dtype == DType::kBf16;
  if (from_float) {
    RETURN_IF_ERROR(ExpectTensor("q", q, q.dtype, {rows, H, D}));
    RETURN_IF_ERROR(CheckTensorFinite("q", q));
    if (q_scale.present) {
      return absl::InvalidArgumentError(
          absl::StrCat("q_scale: expected unset with ", DTypeName(q.dtype), " q"));
    }
  }

  if (L.format == KvFormat::kFp8) {
    if (from_float) {
      scratch->values.resize(static_cast<size_t>(rows * H * D));
      scratch->weights.assign(out.weights, out.weights + rows * H);
      std::vector<float> x(static_cast<size_t>(D));
      for (int64_t rh = 0; rh < rows * H; ++rh) {
        for (int64_t d = 0; d < D; ++d) x[d] = FloatAt(q, rh * D + d);
        const float s = QuantizeFp8Q(x.data(), static_cast<int>(D),
                                     scratch->values.data() + rh * D);
        scratch->weights[rh] *= s;
      }
      out.values = scratch->values.data();
      out.weights = scratch->weights.data();
      return out;
    }
    if (q.dtype != DType::kFp8E4m3) {
      return absl::InvalidArgumentError(absl::StrCat(
          "q: expected [", rows, ", ", H, ", ", D,
          "] FP8_E4M3, FP32 or BF16 for an fp8 layer, got ", DTypeName(q.dtype), " ",
          q.ShapeString()));
    }
    RETURN_IF_ERROR(ExpectTensor("q", q, DType::kFp8E4m3, {rows, H, D}));
    RETURN_IF_ERROR(CheckTensorFinite("q", q));
    if (q_scale.present) {
      return absl::InvalidArgumentError(
          "q_scale: expected unset for an fp8 layer (fold Q scales into weights)");
    }
    out.values = reinterpret_cast<const uint8_t*>(q.data.data());
    return out;
  }

  // MXFP4
  if (from_float) {
    scratch->values.resize(static_cast<size_t>(rows * H * D / 2));
    scratch->scales.resize(static_cast<size_t>(rows * H * D / kMxBlock));
    std::vector<float> x(static_cast<size_t>(D));
    for (int64_t rh = 0; rh < rows * H; ++rh) {
      for (int64_t d = 0; d < D; ++d) x[d] = FloatAt(q, rh * D + d);
      QuantizeMxfp4(x.data(), static_cast<int>(D), scratch->values.data() + rh * D / 2,
                    scratch->scales.data() + rh * D / kMxBlock);
    }
    out.values = scratch->values.data();
    out.scales = scratch->scales.data();
    return out;
  }
  if (q.dtype != DType::kUint8) {
    return absl::InvalidArgumentError(absl::StrCat(
        "q: expected [", rows, ", ", H, ", ", D / 2,
        "] UINT8 packed e2m1 (with q_scale), or FP32/BF16 [", rows, ", ", H, ", ", D,
        "] for an mxfp4 layer, got ", DTypeName(q.dtype), " ", q.ShapeString()));
  }
  RETURN_IF_ERROR(ExpectTensor("q", q, DType::kUint8, {rows, H, D / 2}));
  RETURN_IF_ERROR(ExpectTensor("q_scale", q_scale, DType::kUint8, {rows, H, D / kMxBlock}));
  RETURN_IF_ERROR(CheckScaleBytes("q_scale", q_scale.data));
  out.values = reinterpret_cast<const uint8_t*>(q.data.data());
  out.scales = reinterpret_cast<const uint8_t*>(q_scale.data.data());
  return out;
}

bool DeviceQReady(const GroupSpec& g, const TensorView& q, const TensorView& q_scale,
                  const TensorView& weights) {
  if (!q.on_device || !weights.on_device) return false;
  if (g.layout.format == KvFormat::kFp8) return q.dtype == DType::kFp8E4m3 && !q_scale.present;
  return q.dtype == DType::kUint8 && q_scale.present && q_scale.on_device;
}

absl::StatusOr<BlockQInput> PrepareBlockQ(const GroupSpec& g, int32_t rows,
                                          const TensorView& q,
                                          const TensorView& q_scale,
                                          const TensorView& weights,
                                          std::vector<float>* out) {
  const int64_t H = g.num_heads, D = g.layout.head_dim;
  if (weights.present) {
    return absl::InvalidArgumentError("weights: expected unset for a block layer");
  }
  if (q.dtype != DType::kFp32 && q.dtype != DType::kBf16 && q.dtype != DType::kFp8E4m3) {
    return absl::InvalidArgumentError(absl::StrCat(
        "q: expected [", rows, ", ", H, ", ", D, "] FP32, BF16 or FP8_E4M3 for a block layer, got ",
        DTypeName(q.dtype), " ", q.ShapeString()));
  }
  RETURN_IF_ERROR(ExpectTensor("q", q, q.dtype, {rows, H, D}));
  RETURN_IF_ERROR(CheckTensorFinite("q", q));
  const float* scale = nullptr;
  if (q_scale.present) {
    if (q.dtype != DType::kFp8E4m3) {
      return absl::InvalidArgumentError(
          absl::StrCat("q_scale: expected unset with ", DTypeName(q.dtype), " q"));
    }
    RETURN_IF_ERROR(ExpectTensor("q_scale", q_scale, DType::kFp32, {rows, H}));
    RETURN_IF_ERROR(CheckTensorFinite("q_scale", q_scale));
    scale = reinterpret_cast<const float*>(q_scale.data.data());
  }
  out->resize(static_cast<size_t>(rows * H * D));
  for (int64_t i = 0; i < rows * H * D; ++i) {
    float v = q.dtype == DType::kFp8E4m3
                  ? DecodeE4m3(static_cast<uint8_t>(q.data[static_cast<size_t>(i)]))
                  : FloatAt(q, i);
    if (scale) v *= scale[i / D];
    (*out)[i] = v;
  }
  return BlockQInput{g.num_heads, out->data()};
}

}  // namespace indexer

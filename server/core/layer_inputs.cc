#include "server/core/layer_inputs.h"

#include <cmath>
#include <cstring>
#include <limits>

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

bool IsFp8(DType d) { return d == DType::kFp8E4m3 || d == DType::kFp8E4m3fnuz; }
Fp8Variant VariantOf(DType d) {
  return d == DType::kFp8E4m3fnuz ? Fp8Variant::kE4m3fnuz : Fp8Variant::kE4m3fn;
}

// The FP8 variant of a pre-quantized K's codes (k_fp8), or an error naming
// the field when it is set where no FP8 codes travel.
absl::StatusOr<Fp8Variant> KCodesVariant(const PageLayout& L, const TensorView& k) {
  if (k.fp8_codes == DType::kUnspecified) return Fp8Variant::kE4m3fn;
  if (!IsFp8(k.fp8_codes)) {
    return absl::InvalidArgumentError(absl::StrCat(
        "k_fp8: expected FP8_E4M3 or FP8_E4M3FNUZ (or unset), got ", DTypeName(k.fp8_codes)));
  }
  if (L.format != KvFormat::kFp8 || k.dtype != DType::kUint8) {
    return absl::InvalidArgumentError(absl::StrCat(
        "k_fp8: expected unset unless k is UINT8 pre-quantized entries of an fp8 layer, got ",
        DTypeName(k.fp8_codes), " with ", DTypeName(k.dtype), " k of a ",
        KvFormatName(L.format), " layer"));
  }
  return VariantOf(k.fp8_codes);
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

DType CacheFp8DType(const PageLayout& layout) {
  return layout.fp8 == Fp8Variant::kE4m3fnuz ? DType::kFp8E4m3fnuz : DType::kFp8E4m3;
}

absl::StatusOr<KInput> ValidateK(const GroupSpec& g, int64_t n_new,
                                 const TensorView& k, std::vector<uint8_t>* converted) {
  const PageLayout& L = g.layout;
  KInput out;
  out.ue8m0 = g.ue8m0;
  ASSIGN_OR_RETURN(const Fp8Variant codes, KCodesVariant(L, k));
  if (k.on_device) {
    if (L.format == KvFormat::kFp8 && k.dtype == DType::kUint8 && codes != L.fp8) {
      return absl::InvalidArgumentError(absl::StrCat(
          "k_fp8: a device-resident K must hold the cache's codes, ",
          DTypeName(CacheFp8DType(L)), "; got ", DTypeName(k.fp8_codes),
          " (send it inline or through a host region to have it converted)"));
    }
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
          if (IsFp8Nan(codes, entry[b])) {
            return absl::InvalidArgumentError(absl::StrCat(
                "k: entry ", e, " value ", b, " is an ", Fp8VariantName(codes),
                " NaN code; expected finite"));
          }
        }
        float s;
        memcpy(&s, entry + L.value_bytes(), 4);
        if (!std::isfinite(s) || !(s > 0)) {
          return absl::InvalidArgumentError(absl::StrCat(
              "k: entry ", e, " scale is ", s, "; expected a finite value > 0"));
        }
        if (!std::isfinite(s * Fp8ConversionScale(codes, L.fp8))) {
          return absl::InvalidArgumentError(absl::StrCat(
              "k: entry ", e, " scale ", s, " overflows when its ", Fp8VariantName(codes),
              " codes become ", Fp8VariantName(L.fp8), " (scale x 2); expected at most ",
              std::numeric_limits<float>::max() / 2));
        }
      } else {
        RETURN_IF_ERROR(CheckScaleBytes(
            absl::StrCat("k: entry ", e),
            absl::string_view(reinterpret_cast<const char*>(entry + L.value_bytes()),
                              L.scale_bytes())));
      }
    }
    out.kind = KInput::Kind::kQuantized;
    if (L.format == KvFormat::kFp8 && codes != L.fp8) {
      // Converted, never reinterpreted (SPEC §3): same values, cache's codes.
      converted->assign(p, p + n_new * L.entry_bytes());
      const float factor = Fp8ConversionScale(codes, L.fp8);
      for (int64_t e = 0; e < n_new; ++e) {
        uint8_t* entry = converted->data() + e * L.entry_bytes();
        for (int32_t b = 0; b < L.value_bytes(); ++b) {
          entry[b] = ConvertFp8Code(codes, L.fp8, entry[b]);
        }
        float s;
        memcpy(&s, entry + L.value_bytes(), 4);
        s *= factor;
        memcpy(entry + L.value_bytes(), &s, 4);
      }
      out.data = converted->data();
      return out;
    }
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
      RETURN_IF_ERROR(ExpectTensor("q", q, CacheFp8DType(L), {rows, H, D}));
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
                                     scratch->values.data() + rh * D, L.fp8);
        scratch->weights[rh] *= s;
      }
      out.values = scratch->values.data();
      out.weights = scratch->weights.data();
      return out;
    }
    if (!IsFp8(q.dtype)) {
      return absl::InvalidArgumentError(absl::StrCat(
          "q: expected [", rows, ", ", H, ", ", D,
          "] FP8_E4M3, FP8_E4M3FNUZ, FP32 or BF16 for an fp8 layer, got ", DTypeName(q.dtype),
          " ", q.ShapeString()));
    }
    RETURN_IF_ERROR(ExpectTensor("q", q, q.dtype, {rows, H, D}));
    RETURN_IF_ERROR(CheckTensorFinite("q", q));
    if (q_scale.present) {
      return absl::InvalidArgumentError(
          "q_scale: expected unset for an fp8 layer (fold Q scales into weights)");
    }
    out.values = reinterpret_cast<const uint8_t*>(q.data.data());
    const Fp8Variant from = VariantOf(q.dtype);
    if (from != L.fp8) {
      // Converted, never reinterpreted (SPEC §3): the head's weight carries
      // Q's scale, so it takes the conversion's factor.
      const float factor = Fp8ConversionScale(from, L.fp8);
      scratch->values.resize(static_cast<size_t>(rows * H * D));
      for (int64_t i = 0; i < rows * H * D; ++i) {
        scratch->values[i] = ConvertFp8Code(from, L.fp8, out.values[i]);
      }
      scratch->weights.assign(out.weights, out.weights + rows * H);
      for (int64_t rh = 0; rh < rows * H; ++rh) {
        scratch->weights[rh] *= factor;
        if (!std::isfinite(scratch->weights[rh])) {
          return absl::InvalidArgumentError(absl::StrCat(
              "weights: element ", rh, " overflows when ", DTypeName(q.dtype), " q becomes ",
              DTypeName(CacheFp8DType(L)), " (weight x ", factor, "); expected |w| <= ",
              std::numeric_limits<float>::max() / factor));
        }
      }
      out.values = scratch->values.data();
      out.weights = scratch->weights.data();
    }
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
  if (g.layout.format == KvFormat::kFp8) {
    return q.dtype == CacheFp8DType(g.layout) && !q_scale.present;
  }
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
  if (q.dtype != DType::kFp32 && q.dtype != DType::kBf16 && !IsFp8(q.dtype)) {
    return absl::InvalidArgumentError(absl::StrCat(
        "q: expected [", rows, ", ", H, ", ", D,
        "] FP32, BF16, FP8_E4M3 or FP8_E4M3FNUZ for a block layer, got ",
        DTypeName(q.dtype), " ", q.ShapeString()));
  }
  RETURN_IF_ERROR(ExpectTensor("q", q, q.dtype, {rows, H, D}));
  RETURN_IF_ERROR(CheckTensorFinite("q", q));
  const float* scale = nullptr;
  if (q_scale.present) {
    if (!IsFp8(q.dtype)) {
      return absl::InvalidArgumentError(
          absl::StrCat("q_scale: expected unset with ", DTypeName(q.dtype), " q"));
    }
    RETURN_IF_ERROR(ExpectTensor("q_scale", q_scale, DType::kFp32, {rows, H}));
    RETURN_IF_ERROR(CheckTensorFinite("q_scale", q_scale));
    scale = reinterpret_cast<const float*>(q_scale.data.data());
  }
  out->resize(static_cast<size_t>(rows * H * D));
  for (int64_t i = 0; i < rows * H * D; ++i) {
    float v = IsFp8(q.dtype)
                  ? DecodeFp8(VariantOf(q.dtype), static_cast<uint8_t>(q.data[static_cast<size_t>(i)]))
                  : FloatAt(q, i);
    if (scale) v *= scale[i / D];
    (*out)[i] = v;
  }
  return BlockQInput{g.num_heads, out->data()};
}

}  // namespace indexer

#include "kernels/format/page_layout.h"

#include <cstring>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"

namespace indexer {
namespace {

// Pages are addressed with int64 offsets, but a single page stays well
// inside int32 so that kernels may index within a page in 32 bits.
constexpr int64_t kMaxPageBytes = int64_t{1} << 30;

absl::Status Invalid(absl::string_view field, absl::string_view expected,
                     int64_t got) {
  return absl::InvalidArgumentError(
      absl::StrCat(field, ": expected ", expected, ", got ", got));
}

}  // namespace

const char* Fp8VariantName(Fp8Variant v) {
  return v == Fp8Variant::kE4m3fnuz ? "e4m3fnuz" : "e4m3fn";
}

const char* KvFormatName(KvFormat f) {
  switch (f) {
    case KvFormat::kFp8:
      return "fp8";
    case KvFormat::kMxfp4:
      return "mxfp4";
  }
  return "unknown";
}

absl::StatusOr<PageLayout> PageLayout::Make(KvFormat format, int32_t head_dim,
                                            int32_t page_entries,
                                            int32_t n_per_tile,
                                            int32_t d_per_tile,
                                            int32_t scale_lanes) {
  if (format != KvFormat::kFp8 && format != KvFormat::kMxfp4) {
    return Invalid("kv_format", "fp8 (0) or mxfp4 (1)",
                   static_cast<int32_t>(format));
  }
  if (head_dim <= 0 || head_dim % kMxBlock != 0 || head_dim > 65536) {
    return Invalid("head_dim", "a positive multiple of 32, at most 65536",
                   head_dim);
  }
  if (page_entries < 1) {
    return Invalid("page_entries", "at least 1", page_entries);
  }
  PageLayout l;
  l.format = format;
  l.head_dim = head_dim;
  l.page_entries = page_entries;
  if (l.page_bytes() > kMaxPageBytes) {
    return Invalid("page_entries",
                   absl::StrCat("a page of at most ", kMaxPageBytes,
                                " bytes (", l.entry_bytes(),
                                " bytes per entry), i.e. at most ",
                                kMaxPageBytes / l.entry_bytes(), " entries"),
                   page_entries);
  }
  // The config's proto3 default for scale_lanes is 0, which reads as 1.
  if (scale_lanes == 0) scale_lanes = 1;
  const int32_t vb = l.value_bytes();
  const int32_t scales_per_entry = head_dim / kMxBlock;
  if (n_per_tile < 0) {
    return Invalid("tiling.n_per_tile", "0 (linear) or a positive divisor of "
                   "page_entries", n_per_tile);
  }
  if (n_per_tile == 0) {
    if (d_per_tile != 0) {
      return Invalid("tiling.d_per_tile",
                     "0 in a linear layout (tiling.n_per_tile = 0)",
                     d_per_tile);
    }
    if (scale_lanes != 1) {
      return Invalid("tiling.scale_lanes",
                     "1 in a linear layout (tiling.n_per_tile = 0)",
                     scale_lanes);
    }
    return l;
  }
  if (page_entries % n_per_tile != 0) {
    return Invalid("tiling.n_per_tile",
                   absl::StrCat("a divisor of ", page_entries,
                                " (page_entries)"),
                   n_per_tile);
  }
  if (d_per_tile <= 0 || vb % d_per_tile != 0) {
    return Invalid("tiling.d_per_tile",
                   absl::StrCat("a divisor of ", vb,
                                " (value bytes per entry)"),
                   d_per_tile);
  }
  if (format == KvFormat::kFp8) {
    if (scale_lanes != 1) {
      return Invalid("tiling.scale_lanes",
                     "1 for fp8 (its fp32 scales stay linear)", scale_lanes);
    }
  } else if (scale_lanes < 0 || scales_per_entry % scale_lanes != 0) {
    return Invalid("tiling.scale_lanes",
                   absl::StrCat("a divisor of ", scales_per_entry,
                                " (scales per entry, head_dim / 32)"),
                   scale_lanes);
  }
  l.n_per_tile = n_per_tile;
  l.d_per_tile = d_per_tile;
  l.scale_lanes = scale_lanes;
  return l;
}

std::string PageLayout::DebugString() const {
  std::string s = absl::StrCat(KvFormatName(format),
                               format == KvFormat::kFp8 && fp8 == Fp8Variant::kE4m3fnuz ? " e4m3fnuz" : "",
                               " D=", head_dim,
                               " E=", page_entries, " ", entry_bytes(),
                               " B/entry ", page_bytes(), " B/page ");
  if (!tiled()) {
    absl::StrAppend(&s, "linear");
  } else {
    absl::StrAppend(&s, "tiled(n_per_tile=", n_per_tile,
                    " d_per_tile=", d_per_tile);
    if (format == KvFormat::kMxfp4) {
      absl::StrAppend(&s, " scale_lanes=", scale_lanes);
    }
    absl::StrAppend(&s, ")");
  }
  return s;
}

void StoreEntry(const PageLayout& layout, const uint8_t* linear_entry,
                int32_t e, uint8_t* page) {
  const int32_t vb = layout.value_bytes();
  const int32_t sb = layout.scale_bytes();
  const uint8_t* scales = linear_entry + vb;
  if (!layout.tiled()) {
    std::memcpy(page + layout.ValueOffset(e, 0), linear_entry, vb);
    std::memcpy(page + layout.ScaleOffset(e, 0), scales, sb);
    return;
  }
  for (int32_t b = 0; b < vb; b += layout.d_per_tile) {
    std::memcpy(page + layout.ValueOffset(e, b), linear_entry + b,
                layout.d_per_tile);
  }
  for (int32_t s = 0; s < sb; ++s) page[layout.ScaleOffset(e, s)] = scales[s];
}

void LoadEntry(const PageLayout& layout, const uint8_t* page, int32_t e,
               uint8_t* linear_entry) {
  const int32_t vb = layout.value_bytes();
  const int32_t sb = layout.scale_bytes();
  uint8_t* scales = linear_entry + vb;
  if (!layout.tiled()) {
    std::memcpy(linear_entry, page + layout.ValueOffset(e, 0), vb);
    std::memcpy(scales, page + layout.ScaleOffset(e, 0), sb);
    return;
  }
  for (int32_t b = 0; b < vb; b += layout.d_per_tile) {
    std::memcpy(linear_entry + b, page + layout.ValueOffset(e, b),
                layout.d_per_tile);
  }
  for (int32_t s = 0; s < sb; ++s) scales[s] = page[layout.ScaleOffset(e, s)];
}

}  // namespace indexer

// The byte layout of one indexer K page (SPEC §4). This type is the only
// owner of page and offset arithmetic: the cpu backend, the gpu kernels, the
// server and the tests all go through it.
//
// A page of E entries is a value region (E x VB bytes) followed by a scale
// region (E x SB bytes); VB = D (FP8) or D/2 (MXFP4), SB = 4 (FP8, one fp32)
// or D/32 (MXFP4, e8m0 bytes).
//   linear: entry e's values at e*VB, its scales at E*VB + e*SB.
//   tiled:  the page is cut into runs of n_per_tile entries. Inside a run the
//           values are stored [chunk, entry, byte] with d_per_tile-byte
//           chunks; MXFP4 scales are stored [s % scale_lanes, entry,
//           s / scale_lanes]. FP8 scales stay linear (one word per entry).
//
// Thread safety: a PageLayout is an immutable value; copy it freely, also to
// the device (it is trivially copyable).
#pragma once

#include <cstdint>
#include <string>

#include "absl/status/statusor.h"
#include "kernels/format/hd.h"

namespace indexer {

enum class KvFormat : int32_t { kFp8 = 0, kMxfp4 = 1 };
// The FP8 encoding of an fp8 cache (SPEC §3): OCP e4m3fn, or e4m3fnuz, the
// FP8 of gfx942 hardware. Same page bytes; different code values.
enum class Fp8Variant : int32_t { kE4m3fn = 0, kE4m3fnuz = 1 };

inline constexpr int kMxBlock = 32;  // elements per MXFP4 scale

const char* KvFormatName(KvFormat f);
// "e4m3fn" or "e4m3fnuz" (GetServerInfo's fp8_variant).
const char* Fp8VariantName(Fp8Variant v);

struct PageLayout {
  KvFormat format = KvFormat::kFp8;
  int32_t head_dim = 128;      // D
  int32_t page_entries = 64;   // E
  int32_t n_per_tile = 0;      // 0 = linear order
  int32_t d_per_tile = 0;      // tiled only: value bytes per chunk
  int32_t scale_lanes = 1;     // tiled MXFP4 only
  // FP8 pages: how the value bytes encode (the group config's fp8_variant).
  // Set after Make; ignored for MXFP4.
  Fp8Variant fp8 = Fp8Variant::kE4m3fn;

  // Validates a geometry (D a positive multiple of 32, E >= 1, a tiling that
  // divides the page) and returns it; the error names the offending field.
  static absl::StatusOr<PageLayout> Make(KvFormat format, int32_t head_dim,
                                         int32_t page_entries,
                                         int32_t n_per_tile = 0,
                                         int32_t d_per_tile = 0,
                                         int32_t scale_lanes = 1);

  std::string DebugString() const;

  INDEXER_HD bool tiled() const { return n_per_tile > 0; }
  // VB: value bytes of one entry.
  INDEXER_HD int32_t value_bytes() const {
    return format == KvFormat::kFp8 ? head_dim : head_dim / 2;
  }
  // SB: scale bytes of one entry.
  INDEXER_HD int32_t scale_bytes() const {
    return format == KvFormat::kFp8 ? 4 : head_dim / kMxBlock;
  }
  INDEXER_HD int32_t entry_bytes() const { return value_bytes() + scale_bytes(); }
  INDEXER_HD int64_t page_bytes() const {
    return static_cast<int64_t>(page_entries) * entry_bytes();
  }
  INDEXER_HD int64_t scale_region() const {
    return static_cast<int64_t>(page_entries) * value_bytes();
  }

  // Offset inside a page of value byte `b` (0 <= b < VB) of entry `e`.
  INDEXER_HD int64_t ValueOffset(int32_t e, int32_t b) const {
    const int32_t vb = value_bytes();
    if (!tiled()) return static_cast<int64_t>(e) * vb + b;
    const int32_t run = e / n_per_tile, i = e % n_per_tile;
    const int32_t chunk = b / d_per_tile, cb = b % d_per_tile;
    return static_cast<int64_t>(run) * n_per_tile * vb +
           (static_cast<int64_t>(chunk) * n_per_tile + i) * d_per_tile + cb;
  }

  // Offset inside a page of scale byte `s` (0 <= s < SB) of entry `e`. For
  // FP8 the four bytes of the little-endian fp32 scale.
  INDEXER_HD int64_t ScaleOffset(int32_t e, int32_t s) const {
    const int32_t sb = scale_bytes();
    if (!tiled() || format == KvFormat::kFp8) {
      return scale_region() + static_cast<int64_t>(e) * sb + s;
    }
    const int32_t run = e / n_per_tile, i = e % n_per_tile;
    const int32_t per_lane = sb / scale_lanes;
    return scale_region() + static_cast<int64_t>(run) * n_per_tile * sb +
           (static_cast<int64_t>(s % scale_lanes) * n_per_tile + i) * per_lane +
           s / scale_lanes;
  }

  // Byte offset in a pool of page-contiguous storage.
  INDEXER_HD int64_t PageOffset(int32_t page) const {
    return static_cast<int64_t>(page) * page_bytes();
  }
};

// Copies one entry in linear form (VB value bytes then SB scale bytes) into
// its place in `page` / out of it. These are the only two functions that
// move whole entries between the wire form and the page.
void StoreEntry(const PageLayout& layout, const uint8_t* linear_entry,
                int32_t e, uint8_t* page);
void LoadEntry(const PageLayout& layout, const uint8_t* page, int32_t e,
               uint8_t* linear_entry);

}  // namespace indexer

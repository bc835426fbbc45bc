// Entry addressing for the gpu kernels: a sequence position through the
// block table to its page, then PageLayout for every byte inside the page.
// Kernels reach K only through these helpers and PageLayout (SPEC §4).
#pragma once

#include <cstdint>

#include "kernels/format/hd.h"
#include "kernels/format/page_layout.h"
#include "kernels/geometry/step_geometry.h"

namespace indexer {
namespace gpu {

struct EntryRef {
  const uint8_t* page;  // start of the page holding the entry
  int32_t e;            // entry index inside the page
};

// Entry `pos` of the sequence whose block table row is `block_row`.
// REQUIRES: pos within the sequence's entries (validated by the host).
INDEXER_HD EntryRef LocateEntry(const PageLayout& layout, const uint8_t* pool,
                                const int32_t* block_row, int32_t pos) {
  const int32_t lp = LogicalPage(pos, layout.page_entries);
  return {pool + layout.PageOffset(block_row[lp]), SlotInPage(pos, layout.page_entries)};
}

// A position inside a sequence as (logical page, entry inside the page):
// streaming kernels step it on without a division per step.
struct PagePos {
  int32_t lp;  // index into the sequence's block-table row
  int32_t e;   // entry inside the page
};

INDEXER_HD PagePos PagePosOf(const PageLayout& layout, int32_t pos) {
  return {LogicalPage(pos, layout.page_entries), SlotInPage(pos, layout.page_entries)};
}

// `step` entries on. REQUIRES: page_entries % step == 0, p->e % step == 0.
INDEXER_HD void StepPagePos(const PageLayout& layout, PagePos* p, int32_t step) {
  p->e += step;
  if (p->e == layout.page_entries) {
    ++p->lp;
    p->e = 0;
  }
}

// fp32 scale of an FP8 entry (little-endian word at ScaleOffset(e, 0); the
// scale region keeps it 4-byte aligned since E * D is a multiple of 4).
INDEXER_HD float Fp8EntryScale(const PageLayout& layout, EntryRef r) {
  return *reinterpret_cast<const float*>(r.page + layout.ScaleOffset(r.e, 0));
}

}  // namespace gpu
}  // namespace indexer

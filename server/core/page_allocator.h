// Physical page allocator of one layer group. Every layer of the group has a
// pool with the same page numbering, so one allocation serves all of them.
//
// Invariant (SPEC §4), checked by CheckInvariant(): free + used == total and
// every page is either free or used, never both.
//
// Thread safety: none; the Engine serializes access under its mutex.
#pragma once

#include <cstdint>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/types/span.h"

namespace indexer {

class PageAllocator {
 public:
  explicit PageAllocator(int64_t total_pages);

  // `n` pages, all or nothing. RESOURCE_EXHAUSTED (allocating nothing) when
  // fewer than `n` are free.
  absl::StatusOr<std::vector<int32_t>> Allocate(int64_t n);
  // Returns pages taken by Allocate. REQUIRES: each page is in use.
  void Free(absl::Span<const int32_t> pages);

  int64_t total() const { return total_; }
  int64_t free() const { return static_cast<int64_t>(free_list_.size()); }
  int64_t used() const { return total_ - free(); }

  // INTERNAL when the free list has duplicates, out-of-range pages, or does
  // not match the used flags.
  absl::Status CheckInvariant() const;

 private:
  int64_t total_;
  std::vector<int32_t> free_list_;  // LIFO: recently freed pages are warm
  std::vector<bool> in_use_;
};

}  // namespace indexer

#include "server/core/page_allocator.h"

#include "absl/strings/str_cat.h"

namespace indexer {

PageAllocator::PageAllocator(int64_t total_pages)
    : total_(total_pages), in_use_(static_cast<size_t>(total_pages), false) {
  free_list_.reserve(static_cast<size_t>(total_pages));
  // Highest first so that pops hand out 0, 1, 2, ...
  for (int64_t p = total_pages - 1; p >= 0; --p) {
    free_list_.push_back(static_cast<int32_t>(p));
  }
}

absl::StatusOr<std::vector<int32_t>> PageAllocator::Allocate(int64_t n) {
  if (n < 0) return absl::InvalidArgumentError("page count must be >= 0");
  if (n > free()) {
    return absl::ResourceExhaustedError(absl::StrCat(
        "needs ", n, " pages, ", free(), " of ", total_, " free"));
  }
  std::vector<int32_t> out(free_list_.end() - n, free_list_.end());
  free_list_.resize(free_list_.size() - static_cast<size_t>(n));
  for (int32_t p : out) in_use_[p] = true;
  return out;
}

void PageAllocator::Free(absl::Span<const int32_t> pages) {
  for (int32_t p : pages) {
    in_use_[p] = false;
    free_list_.push_back(p);
  }
}

absl::Status PageAllocator::CheckInvariant() const {
  std::vector<bool> seen(static_cast<size_t>(total_), false);
  for (int32_t p : free_list_) {
    if (p < 0 || p >= total_) {
      return absl::InternalError(absl::StrCat("free page ", p, " out of range"));
    }
    if (seen[p]) return absl::InternalError(absl::StrCat("page ", p, " freed twice"));
    if (in_use_[p]) {
      return absl::InternalError(absl::StrCat("page ", p, " both free and used"));
    }
    seen[p] = true;
  }
  int64_t used_count = 0;
  for (bool u : in_use_) used_count += u;
  if (used_count + free() != total_) {
    return absl::InternalError(absl::StrCat("free ", free(), " + used ", used_count,
                                            " != total ", total_));
  }
  return absl::OkStatus();
}

}  // namespace indexer

#include "kernels/gpu/device_arena.h"

#include <algorithm>
#include <iterator>

#include "absl/strings/str_cat.h"

namespace indexer {
namespace gpu {

DeviceArena::DeviceArena(uint8_t* base, int64_t bytes)
    : base_(base), bytes_(bytes) {
  if (bytes > 0) free_[0] = bytes;
}

absl::StatusOr<uint8_t*> DeviceArena::Allocate(int64_t bytes, const char* what) {
  const int64_t want = (std::max<int64_t>(bytes, 1) + 255) / 256 * 256;
  absl::MutexLock lock(&mu_);
  for (auto it = free_.begin(); it != free_.end(); ++it) {
    if (it->second < want) continue;
    const int64_t off = it->first, size = it->second;
    free_.erase(it);
    if (size > want) free_[off + want] = size - want;
    used_[off] = want;
    return base_ + off;
  }
  return absl::ResourceExhaustedError(
      absl::StrCat(what, ": ", bytes, " bytes do not fit the gpu step arena of ",
                   bytes_, " bytes"));
}

void DeviceArena::Release(uint8_t* p) {
  absl::MutexLock lock(&mu_);
  auto u = used_.find(p - base_);
  if (u == used_.end()) return;
  int64_t off = u->first, size = u->second;
  used_.erase(u);
  auto next = free_.lower_bound(off);
  if (next != free_.end() && next->first == off + size) {
    size += next->second;
    next = free_.erase(next);
  }
  if (next != free_.begin()) {
    auto prev = std::prev(next);
    if (prev->first + prev->second == off) {
      prev->second += size;
      return;
    }
  }
  free_[off] = size;
}

}  // namespace gpu
}  // namespace indexer

// First-fit sub-allocator over one device buffer taken at start-up, for the
// per-step metadata (block tables, row lengths, the work plan): steps come
// and go without touching the device allocator.
//
// Thread safety: all methods are safe to call concurrently.
#pragma once

#include <cstdint>
#include <map>

#include "absl/base/thread_annotations.h"
#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"

namespace indexer {
namespace gpu {

class DeviceArena {
 public:
  // Manages [base, base + bytes); does not own it.
  DeviceArena(uint8_t* base, int64_t bytes);

  // `bytes` rounded up to 256, or RESOURCE_EXHAUSTED naming `what`.
  absl::StatusOr<uint8_t*> Allocate(int64_t bytes, const char* what);
  // REQUIRES: p came from Allocate and is not yet released.
  void Release(uint8_t* p);

 private:
  uint8_t* const base_;
  const int64_t bytes_;
  absl::Mutex mu_;
  std::map<int64_t, int64_t> free_ ABSL_GUARDED_BY(mu_);  // offset -> size
  std::map<int64_t, int64_t> used_ ABSL_GUARDED_BY(mu_);
};

}  // namespace gpu
}  // namespace indexer

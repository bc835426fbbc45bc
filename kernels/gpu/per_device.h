// Host set-up a kernel needs once per device, kept off the launch path.
//
// The dynamic shared-memory opt-in (SetMaxDynamicSmem) is a function
// attribute of the current device in both runtimes, and blocks per SM are a
// fact of the device. A process-wide `static` initialised by the first launch
// would leave every other device of the process without the opt-in (its
// launches then fail for want of shared memory) and with the first device's
// occupancy. PerDevice<T> keeps one value per device ordinal, computed by the
// first launch on that device (absl::call_once: concurrent first launches
// compute it once).
#pragma once

#include <array>
#include <optional>
#include <utility>

#include "absl/base/call_once.h"
#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "kernels/gpu/gpu_compat.h"

namespace indexer {
namespace gpu {

template <class T>
class PerDevice {
 public:
  // Ordinals past this are set up on every launch (correct, only slower).
  static constexpr int kMaxDevices = 64;

  // The value for the calling thread's current device: `init()` (returning T)
  // on that device's first call, the stored value after.
  template <class F>
  T Get(F&& init) {
    int device = -1;
    if (GetDevice(&device) != kSuccess || device < 0 || device >= kMaxDevices) {
      (void)GetLastError();  // a failed query leaves the runtime's error set
      return init();
    }
    Slot& s = slots_[device];
    absl::call_once(s.once, [&] { (void)s.value.emplace(std::forward<F>(init)()); });
    return *s.value;
  }

 private:
  struct Slot {
    absl::once_flag once;
    std::optional<T> value;
  };
  std::array<Slot, kMaxDevices> slots_;
};

}  // namespace gpu
}  // namespace indexer

// Entry points of the gpu backend for kernels/backend.cc. Nothing here needs
// a GPU toolchain to include.
#pragma once

#include <memory>

#include "absl/status/statusor.h"
#include "kernels/backend.h"

namespace indexer {

// GPUs this build can use; 0 without a driver or device (never an error).
int GpuDeviceCount();

// The gpu backend on device `ordinal`. `threads` is unused (host work is
// small). Takes all its device memory and pinned host staging here:
// workspace now, pools at AllocatePool (start-up); nothing is allocated on
// the request path.
absl::StatusOr<std::unique_ptr<Backend>> MakeGpuBackend(int ordinal,
                                                        int threads);

}  // namespace indexer

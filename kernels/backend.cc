#include "kernels/backend.h"

#include <memory>
#include <string>

#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "kernels/cpu/cpu_backend.h"

#ifdef INDEXER_HAVE_GPU
#include "kernels/gpu/gpu_backend.h"
#endif

namespace indexer {
namespace {

constexpr char kAccepted[] = "\"auto\", \"cpu\", \"gpu\" or \"gpu:N\"";

// The ordinal of "gpu" (0) or "gpu:N", or -1 when `device` is neither.
int GpuOrdinal(const std::string& device) {
  if (device == "gpu") return 0;
  if (!absl::StartsWith(device, "gpu:")) return -1;
  const std::string digits = device.substr(4);
  if (digits.empty() || digits.find_first_not_of("0123456789") !=
                            std::string::npos) {
    return -1;
  }
  int ordinal = -1;
  if (!absl::SimpleAtoi(digits, &ordinal)) return -1;
  return ordinal;
}

}  // namespace

absl::StatusOr<std::unique_ptr<Backend>> MakeBackend(const std::string& device,
                                                     int threads) {
  if (threads < 0) {
    return absl::InvalidArgumentError(absl::StrCat(
        "threads: expected >= 0 (0 = all cores), got ", threads));
  }
  if (device == "cpu") return std::make_unique<CpuBackend>(threads);
  if (device == "auto") {
#ifdef INDEXER_HAVE_GPU
    if (GpuDeviceCount() > 0) return MakeGpuBackend(0, threads);
#endif
    return std::make_unique<CpuBackend>(threads);
  }
  const int ordinal = GpuOrdinal(device);
  if (ordinal < 0) {
    return absl::InvalidArgumentError(absl::StrCat(
        "device: expected ", kAccepted, ", got \"", device, "\""));
  }
#ifdef INDEXER_HAVE_GPU
  const int count = GpuDeviceCount();
  if (count <= 0) {
    return absl::UnavailableError(absl::StrCat(
        "device: ", device, " requested but no GPU is visible"));
  }
  if (ordinal >= count) {
    return absl::InvalidArgumentError(absl::StrCat(
        "device: expected gpu:N with N in [0, ", count, "), got \"", device,
        "\""));
  }
  return MakeGpuBackend(ordinal, threads);
#else
  return absl::InvalidArgumentError(
      absl::StrCat("device: ", device,
                   " requested but this build has no GPU backend (built with "
                   "GPU=OFF)"));
#endif
}

}  // namespace indexer

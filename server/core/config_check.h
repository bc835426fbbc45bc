// Start-up checks of the daemon config (SPEC §9 bounded resources): every
// integer field range-checked with the field named before anything converts
// it (max_message_mb << 20 must not wrap), the trust defaults filled in, and
// the K cache compared with the memory the device can hold.
#pragma once

#include <cstdint>
#include <string>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "config/config.pb.h"

namespace indexer {

struct Model;

// Defaults of the trust keys (SPEC §9); see config.proto.
inline constexpr uint64_t kDefaultStepIdleMs = 30000;
inline constexpr uint32_t kDefaultLayerSpinUs = 200;
inline constexpr uint32_t kDefaultRingSpinUs = 200;
inline constexpr uint64_t kDefaultKeepaliveMs = 20000;
inline constexpr uint64_t kDefaultKeepaliveTimeoutMs = 10000;
inline constexpr uint32_t kDefaultMaxReservedPct = 50;
inline constexpr uint64_t kDefaultMaxBytesInFlightMb = 1024;
inline constexpr uint64_t kDefaultMemoryQuotaMb = 4096;
inline constexpr char kDefaultClientIdHeader[] = "x-indexer-client";
inline constexpr char kDefaultListen[] = "127.0.0.1:50061";
inline constexpr uint64_t kDefaultDrainDelayMs = 2000;

// Fills the defaults of the top-level limits and the trust keys (0 or unset
// = default), then checks every top-level integer against its range.
// INVALID_ARGUMENT names the field, the range and the value. Group fields
// are checked by BuildModel.
absl::Status FillAndCheckLimits(config::ServerConfig* cfg);

// Bytes the model's K pools take (all layers, explicit and shared pages).
int64_t PoolBytes(const Model& model);

// RESOURCE_EXHAUSTED naming cache_mb when the pools do not fit in
// `available_bytes` of `where` ("host memory (MemAvailable)", "gpu:0 memory").
absl::Status CheckCacheFits(const Model& model, int64_t available_bytes,
                            const std::string& where);

// Memory the host can give now: MemAvailable of /proc/meminfo, else the
// physical pages (sysconf). NOT_FOUND when neither is readable.
absl::StatusOr<int64_t> HostAvailableBytes();

}  // namespace indexer

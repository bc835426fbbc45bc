// Transport settings shared by indexerd, the client library and
// grpc_echo_bench, so that the echo stays a "same transport" ceiling of the
// daemon's per-layer round trip (SPEC §8).
//
// A 64-row decode layer moves ~0.57 MB of request and 0.5 MB of reply per
// round trip. What these settings address, measured on loopback
// (tests/bench/results/, the service section):
//
//  - glibc malloc: gRPC's read slices and protobuf's bytes fields of this
//    size lie above malloc's mmap threshold or are returned to the kernel by
//    heap trimming as soon as they are freed, so every round trip faulted in
//    fresh zeroed pages (~75 page faults and the madvise/munmap that undoes
//    them per echo round trip). TuneAllocator() keeps them in the heap.
//    What a heap keeps is kept per malloc arena, and glibc makes up to
//    8 x cores arenas as threads allocate (gRPC's thread pool grows with
//    the clients): the daemon's RSS then grew without a leak. The cpu
//    backend's soak with the deepseek-v4.1-fp8 profile (2 cores, so 16
//    arenas; 4 client threads, 150 s; heaptrack: ~70 MB live at the peak,
//    no leak) went from 437 MB after warm-up to 547 MB at the end, still
//    growing; at 8 arenas 482 -> 583; at 4, 415 -> 447; at 2, 299 -> 310
//    (session 27). The echo's round trip did not move at 4. So
//    TuneAllocator() also caps the arenas at kMaxArenas, unless
//    MALLOC_ARENA_MAX is set.
//  - gRPC settings: AddServerArguments / AddChannelArguments set the
//    message limits identically on both ends. (HTTP/2 frame and window
//    sizes, BDP probing, write buffer and TCP read chunk sizes were tried
//    and gave no gain above the noise: none is set.)
#pragma once

#include <malloc.h>

#include <climits>
#include <cstdint>
#include <cstdlib>

#include <grpcpp/grpcpp.h>
#include <grpcpp/resource_quota.h>
#include <grpcpp/server_builder.h>

namespace indexer::transport {

// Allocations up to this size come from the heap, not from mmap (glibc's
// upper limit for the threshold on 64-bit hosts is 32 MiB).
inline constexpr int kMmapThresholdBytes = 32 << 20;
// Free memory at the top of a heap kept for the next message instead of
// being returned to the kernel (per malloc arena).
inline constexpr int kTrimThresholdBytes = 64 << 20;

// Malloc arenas at most (glibc's default is 8 per core): threads share
// them, so what the heaps keep at their tops (above) is at most this many
// times kTrimThresholdBytes. Freed chunks below a heap's top stay as well,
// so the kept total follows the heaps' high-water mark (a V4.1 long-context
// GPU soak kept 336 MB free beside 29 MB live, session 35); the daemon's
// indexer_heap_bytes metric reports both. The environment's
// MALLOC_ARENA_MAX, when set, wins.
inline constexpr int kMaxArenas = 4;

// Process-wide malloc settings for large messages: call once, early in
// main() (before threads allocate). Fixing the thresholds also turns off
// glibc's dynamic threshold. Costs retained free memory: up to
// kTrimThresholdBytes at each arena's top (at most kMaxArenas arenas) and
// the freed chunks below it (kMaxArenas above).
// Returns false when glibc refused a value.
inline bool TuneAllocator() {
  const bool mmap_ok = mallopt(M_MMAP_THRESHOLD, kMmapThresholdBytes) == 1;
  const bool trim_ok = mallopt(M_TRIM_THRESHOLD, kTrimThresholdBytes) == 1;
  const bool arena_ok =
      std::getenv("MALLOC_ARENA_MAX") != nullptr || mallopt(M_ARENA_MAX, kMaxArenas) == 1;
  return mmap_ok && trim_ok && arena_ok;
}

// Message limits: `max_message_bytes` <= 0 means unlimited.
inline int MessageLimit(int64_t max_message_bytes) {
  if (max_message_bytes <= 0) return -1;
  return static_cast<int>(max_message_bytes > INT_MAX ? INT_MAX : max_message_bytes);
}

inline void AddServerArguments(grpc::ServerBuilder& builder, int64_t max_message_bytes) {
  const int limit = MessageLimit(max_message_bytes);
  builder.SetMaxReceiveMessageSize(limit);
  builder.SetMaxSendMessageSize(limit);
}

// The daemon's transport bounds (SPEC §9), from its config.
struct ServerLimits {
  int64_t max_message_bytes = 0;     // <= 0: unlimited
  int64_t keepalive_ms = 0;          // ping a silent peer after this long; 0 = gRPC's default
  int64_t keepalive_timeout_ms = 0;  // drop it when no ack comes within this
  int64_t memory_quota_bytes = 0;    // gRPC resource quota; 0 = unbounded
};

// Message limits as above; HTTP/2 keepalive so that a peer gone silent
// (a partition without a reset) is detected and its streams cancelled
// (which rolls their steps back); and a gRPC resource quota that bounds the
// memory gRPC takes for requests before the service admits them.
inline void AddServerArguments(grpc::ServerBuilder& builder, const ServerLimits& limits) {
  AddServerArguments(builder, limits.max_message_bytes);
  auto ms = [](int64_t v) { return static_cast<int>(v > INT_MAX ? INT_MAX : v); };
  if (limits.keepalive_ms > 0) {
    builder.AddChannelArgument(GRPC_ARG_KEEPALIVE_TIME_MS, ms(limits.keepalive_ms));
    // Pings continue on a connection without calls, and without data:
    // an idle front-end's connection is checked too.
    builder.AddChannelArgument(GRPC_ARG_KEEPALIVE_PERMIT_WITHOUT_CALLS, 1);
    builder.AddChannelArgument(GRPC_ARG_HTTP2_MAX_PINGS_WITHOUT_DATA, 0);
  }
  if (limits.keepalive_timeout_ms > 0) {
    builder.AddChannelArgument(GRPC_ARG_KEEPALIVE_TIMEOUT_MS, ms(limits.keepalive_timeout_ms));
  }
  if (limits.memory_quota_bytes > 0) {
    grpc::ResourceQuota quota("indexerd");
    quota.Resize(static_cast<size_t>(limits.memory_quota_bytes));
    builder.SetResourceQuota(quota);
  }
}

inline void AddChannelArguments(grpc::ChannelArguments& args, int64_t max_message_bytes) {
  const int limit = MessageLimit(max_message_bytes);
  args.SetMaxReceiveMessageSize(limit);
  args.SetMaxSendMessageSize(limit);
}

}  // namespace indexer::transport

// A request ring (AttachRing in indexer.proto; feature "host_ring"): the
// byte layout and the futex protocol that a client and the daemon share in
// a host region the client registered. Plain C++17, no gRPC: both ends
// include it.
//
// Layout, at the ring's offset in the region (64-byte aligned):
//   [0, 256)                      RingHeader
//   [256, 256 + n * S)            n request slots of S bytes
//   [256 + n * S, 256 + 2 n * S)  n response slots of S bytes
// with n = slot_count (a power of two, 1..kMaxSlots) and S = slot_bytes
// (a multiple of 64, kMinSlotBytes..kMaxSlotBytes). Each slot starts with
// a SlotHeader; its payload follows.
//
// Messages. Request k (k = 0, 1, ... counted over the ring's life) lives in
// request slot k % n: one serialized indexer.v1.StepRequest (header, layer,
// commit or abort), its tensors as region references (TensorRef; any host
// or device region of the same client, the ring's own included) or small
// inline bytes. Every request gets exactly one response, in order, in
// response slot k % n: SlotHeader.code 0 and a serialized StepResponse
// (empty for a header, LayerReply for a layer, StepCommitted, StepAborted),
// or an absl status code and its message (UTF-8). After an error the step
// that was open is rolled back (as on the Step stream) and the ring takes
// the next header.
//
// Ordering contract. The client writes a request's slot, then publishes it
// by storing req_head = k + 1 (release); its inputs (the regions it names)
// must be complete by then. The daemon writes the response slot, then
// stores resp_head = k + 1 (release); the outputs (topk_out) are complete
// when the client sees it. The client posts request k only when
// k - resp_tail < n (room in both rings) and stores resp_tail after it has
// read a response. The daemon owns req_tail, resp_head, server_sleeping
// and detached; the client owns req_head, resp_tail and client_sleeping.
//
// Doorbell. Each side spins on the word it waits for, then sleeps on it
// with FUTEX_WAIT (shared, not private: the two ends are processes). Before
// sleeping it sets its *_sleeping word to 1 and reads the waited-for word
// again (both sequentially consistent); the other side stores the word
// first, then reads the sleeping flag and calls FUTEX_WAKE only if it is 1.
// Either the sleeper sees the new value or the waker sees the flag, so no
// wake-up is lost and none is made while the peer spins.
//
// Detach. When the daemon lets go of the ring (DetachRing, the region
// unregistered or expired, shutdown) it stores detached = 1 and wakes
// resp_head; a client that waits then sees the ring gone.
#pragma once

#include <linux/futex.h>
#include <sys/syscall.h>
#include <unistd.h>

#include <atomic>
#include <climits>
#include <cstddef>
#include <cstdint>
#include <ctime>

namespace indexer::ring_wire {

inline constexpr uint32_t kMagic = 0x49585247;  // "GRXI" in memory: little-endian "IXRG"
inline constexpr uint32_t kVersion = 1;
inline constexpr uint32_t kHeaderBytes = 256;
inline constexpr uint32_t kSlotHeaderBytes = 16;
inline constexpr uint32_t kMinSlotBytes = 1024;
inline constexpr uint32_t kMaxSlotBytes = 16u << 20;
inline constexpr uint32_t kMaxSlots = 1024;
inline constexpr uint64_t kAlignment = 64;

// 32-bit futex words, each written by one side only.
struct RingHeader {
  // Written once by the client before AttachRing; the daemon copies them.
  uint32_t magic;
  uint32_t version;
  uint32_t slot_count;
  uint32_t slot_bytes;
  uint8_t pad0[48];
  // Client side (its own cache line).
  std::atomic<uint32_t> req_head;         // requests published
  std::atomic<uint32_t> resp_tail;        // responses read
  std::atomic<uint32_t> client_sleeping;  // 1 while it sleeps on resp_head
  uint8_t pad1[52];
  // Daemon side.
  std::atomic<uint32_t> req_tail;         // requests taken
  std::atomic<uint32_t> resp_head;        // responses published
  std::atomic<uint32_t> server_sleeping;  // 1 while it sleeps on req_head
  std::atomic<uint32_t> detached;         // 1 once the daemon let go
  uint8_t pad2[112];
};
static_assert(sizeof(RingHeader) == kHeaderBytes, "the header is 256 bytes on the wire");
static_assert(sizeof(std::atomic<uint32_t>) == 4 && std::atomic<uint32_t>::is_always_lock_free,
              "futex words are plain 32-bit words");

struct SlotHeader {
  uint32_t bytes;  // payload bytes after this header
  int32_t code;    // responses: absl::StatusCode (0 = ok); requests: 0
  uint32_t seq;    // the message's number k (low 32 bits), for checks
  uint32_t reserved;
};
static_assert(sizeof(SlotHeader) == kSlotHeaderBytes, "the slot header is 16 bytes");

// Bytes of a ring with these parameters, header included.
constexpr uint64_t RingBytes(uint32_t slot_count, uint32_t slot_bytes) {
  return kHeaderBytes + 2ull * slot_count * slot_bytes;
}
constexpr uint64_t RequestSlotOffset(uint32_t slot_count, uint32_t slot_bytes, uint32_t k) {
  return kHeaderBytes + uint64_t{k % slot_count} * slot_bytes;
}
constexpr uint64_t ResponseSlotOffset(uint32_t slot_count, uint32_t slot_bytes, uint32_t k) {
  return kHeaderBytes + uint64_t{slot_count} * slot_bytes + uint64_t{k % slot_count} * slot_bytes;
}

// The doorbell, as both sides ring it. Shared futexes (not FUTEX_PRIVATE):
// the peer is another process. A wait returns on a wake, a changed word,
// a signal or the timeout; callers re-check the counters in every case.
inline void FutexWait(std::atomic<uint32_t>* word, uint32_t expected, int timeout_ms) {
  timespec ts{timeout_ms / 1000, static_cast<long>(timeout_ms % 1000) * 1000000L};
  syscall(SYS_futex, reinterpret_cast<uint32_t*>(word), FUTEX_WAIT, expected, &ts, nullptr, 0);
}

inline void FutexWake(std::atomic<uint32_t>* word) {
  syscall(SYS_futex, reinterpret_cast<uint32_t*>(word), FUTEX_WAKE, INT_MAX, nullptr, nullptr, 0);
}

// One step of a spin (the core's pause hint).
inline void CpuRelax() {
#if defined(__x86_64__) || defined(__i386__)
  __builtin_ia32_pause();
#elif defined(__aarch64__)
  asm volatile("yield");
#endif
}

}  // namespace indexer::ring_wire

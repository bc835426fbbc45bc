// Memfds passed over the daemon's memfd socket (server/rpc/memfd_socket.h)
// and waiting to be registered as host regions (HostRegion.memfd_token).
// No sockets and no gRPC here: the socket hands each received descriptor to
// Issue, RegisterRegion redeems the token.
//
// A token is 128 random bits (32 hex digits), single-use, bound to the
// sender's uid and pid (SO_PEERCRED), and expires after the TTL: its memfd is
// closed then, by the next call of any kind (the socket's thread calls Expire
// at least every second, so an abandoned memfd does not outlive the TTL by
// much).
//
// Ownership: the store owns every descriptor it holds and closes it on
// redemption, expiry or destruction; the region's mapping keeps the memory.
//
// Thread safety: MemfdTokens is thread-safe.
#pragma once

#include <cstdint>
#include <deque>
#include <functional>
#include <optional>
#include <string>

#include "absl/container/flat_hash_map.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "absl/synchronization/mutex.h"

namespace indexer {

// What the socket knew of a memfd's sender, and what the memfd is.
struct MemfdClaim {
  int fd = -1;             // owned by the store; valid during the callback only
  uint32_t uid = 0;        // sender's credentials (SO_PEERCRED)
  int32_t pid = 0;
  std::string memfd_name;  // from /proc/self/fd: "memfd:<name>"
};

class MemfdTokens {
 public:
  using NowMs = std::function<int64_t()>;

  // Unredeemed tokens at once, over all senders and per sender uid: each
  // holds a descriptor.
  static constexpr size_t kMaxTokens = 256;
  static constexpr size_t kMaxTokensPerUid = 64;

  // `ttl_ms` 0 = the default, 10000. `now`: a monotonic clock in ms.
  explicit MemfdTokens(uint64_t ttl_ms, NowMs now = nullptr);
  ~MemfdTokens();  // closes every descriptor still held
  MemfdTokens(const MemfdTokens&) = delete;
  MemfdTokens& operator=(const MemfdTokens&) = delete;

  uint64_t ttl_ms() const { return ttl_ms_; }

  // Takes `fd` (closed on every error path). It must be a read-write memfd
  // that is or can be sealed against shrinking (memfd_create with
  // MFD_ALLOW_SEALING): the store adds F_SEAL_SHRINK, so the memory a region
  // maps is never cut under the daemon (a SIGBUS). Errors name "fd" and are
  // meant for the sender (the socket's reply): INVALID_ARGUMENT for a
  // descriptor of the wrong kind, RESOURCE_EXHAUSTED over the limits above.
  absl::StatusOr<std::string> Issue(int fd, uint32_t uid, int32_t pid);

  // Runs `use` with the memfd `token` names and spends the token when `use`
  // succeeds; on any error the token stays as it was. `caller_uid`: the
  // redeeming caller's uid when known (must equal the sender's, else
  // PERMISSION_DENIED). Errors name `field` ("host.memfd_token"):
  // INVALID_ARGUMENT (not 32 hex digits), NOT_FOUND (unknown, expired or
  // already used, said which when the store still remembers).
  absl::StatusOr<uint64_t> Redeem(
      absl::string_view field, absl::string_view token, std::optional<uint32_t> caller_uid,
      const std::function<absl::StatusOr<uint64_t>(const MemfdClaim&)>& use);

  // Closes the memfds of expired tokens.
  void Expire();

  // Unredeemed tokens (tests).
  size_t size() const;

 private:
  struct Held {
    MemfdClaim claim;
    int64_t expires_ms = 0;
  };
  void ExpireLocked(int64_t now) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // RESOURCE_EXHAUSTED when `uid` or everyone is at the limit.
  absl::Status CheckRoomLocked(uint32_t uid) const ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  void RetireLocked(const std::string& token, const char* why)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);

  const uint64_t ttl_ms_;
  const NowMs now_;
  mutable absl::Mutex mu_;
  absl::flat_hash_map<std::string, Held> held_ ABSL_GUARDED_BY(mu_);
  absl::flat_hash_map<uint32_t, size_t> per_uid_ ABSL_GUARDED_BY(mu_);
  // Recently spent or expired tokens, so that a reuse is told apart from a
  // typo; bounded (oldest forgotten first).
  absl::flat_hash_map<std::string, const char*> retired_ ABSL_GUARDED_BY(mu_);
  std::deque<std::string> retired_order_ ABSL_GUARDED_BY(mu_);
};

}  // namespace indexer

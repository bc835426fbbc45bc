// The daemon's memfd socket: the side channel over which a client on this
// host passes a memfd (SCM_RIGHTS), since gRPC cannot carry descriptors. The
// wire is in proto/memfd_wire.h and HostRegion's comment in indexer.proto;
// the tokens it answers are MemfdTokens' (server/core/memfd_tokens.h).
//
// One thread serves every connection (poll; the socket is SOCK_SEQPACKET, so
// a message is one request). Garbage (no descriptor, several, bytes other
// than the hello, a truncated message) gets an "error ..." reply, every
// descriptor that came with it is closed and the connection is dropped; the
// daemon carries on. At most kMaxConnections at once; a connection silent
// for kIdleMs is dropped.
//
// Thread safety: Start and Stop from one thread (the server's owner).
#pragma once

#include <memory>
#include <string>
#include <thread>

#include "absl/status/statusor.h"
#include "server/core/memfd_tokens.h"

namespace indexer {

class MemfdSocket {
 public:
  static constexpr int kMaxConnections = 64;
  static constexpr int kIdleMs = 30000;

  // Binds `path` (a socket file already there, e.g. left by a killed
  // daemon, is replaced; anything else there is an error), makes it
  // connectable by every local user (mode 0666: a memfd grants the daemon
  // memory and nothing else; the token is bound to the sender's uid) and
  // starts serving. `tokens` must outlive the socket.
  static absl::StatusOr<std::unique_ptr<MemfdSocket>> Start(const std::string& path,
                                                           MemfdTokens* tokens);
  ~MemfdSocket();  // Stop()

  // Stops the thread, closes every connection and removes the socket file.
  // Idempotent.
  void Stop();
  const std::string& path() const { return path_; }

 private:
  MemfdSocket(std::string path, MemfdTokens* tokens, int listen_fd, int wake_fd);
  void Loop();

  const std::string path_;
  MemfdTokens* const tokens_;
  int listen_fd_;
  int wake_fd_;  // an eventfd: Stop's signal to the thread
  std::thread thread_;
};

// The memfd socket a daemon listening on `listen` opens for config value
// `configured`: itself unless "" ("off" = none), else "<path>.fd" for a
// "unix:<path>" listener, else none ("").
std::string MemfdSocketPath(const std::string& configured, const std::string& listen);

}  // namespace indexer

// The daemon's memfd socket (HostRegion.memfd_token in indexer.proto): the
// few constants both ends of that side channel share. gRPC cannot carry file
// descriptors, so a client passes a memfd over a SOCK_SEQPACKET Unix socket
// and names it in RegisterRegion by the token it got back.
//
//   client -> daemon: one message, the kHello bytes, with exactly one file
//                     descriptor (SCM_RIGHTS)
//   daemon -> client: "ok <token> <ttl_ms>" or "error <message>"
//
// A connection may pass several memfds, one message each; the daemon closes
// it after an error reply.
#pragma once

#include <cstddef>

namespace indexer::memfd_wire {

inline constexpr char kHello[] = "indexer.memfd.v1";
inline constexpr size_t kHelloBytes = sizeof(kHello) - 1;
inline constexpr size_t kTokenHexDigits = 32;
// Longest reply the daemon sends (error messages are capped to fit).
inline constexpr size_t kMaxReplyBytes = 512;

}  // namespace indexer::memfd_wire

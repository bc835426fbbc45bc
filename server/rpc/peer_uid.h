// The uid of the process behind a gRPC peer, where this host can tell: a TCP
// peer whose socket is in this network namespace's socket table
// (/proc/net/tcp, tcp6), i.e. a client on this host. gRPC exposes no
// credentials of a Unix-socket peer; such a peer is reported as kUnix (the
// socket file's mode decides who connects).
#pragma once

#include <cstdint>
#include <optional>
#include <string>

#include "absl/strings/string_view.h"

namespace indexer {

struct PeerUid {
  enum Kind { kTcp, kUnix, kOther } kind = kOther;
  std::optional<uint32_t> uid;  // kTcp found in the socket table
};

// `peer`: grpc::ServerContext::peer() ("ipv4:127.0.0.1:5000",
// "ipv6:[::1]:5000", "ipv6:%5B::1%5D:5000", "unix:...").
PeerUid LookupPeerUid(absl::string_view peer);

}  // namespace indexer

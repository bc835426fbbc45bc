// Listener security (SPEC §9): the server credentials for the config's `tls`
// block and the optional authorization policy. Certificates are re-read from
// disk every tls.refresh_s seconds by gRPC's file-watcher provider, so a
// rotated certificate is served to new connections without a restart.
#pragma once

#include <memory>
#include <string>

#include "absl/status/statusor.h"
#include "config/config.pb.h"
#include "grpcpp/security/server_credentials.h"

namespace indexer {

class AuthzPolicy;

struct ListenerSecurity {
  std::shared_ptr<grpc::ServerCredentials> credentials;
  bool tls = false;
  bool mutual_tls = false;  // client certificates required and verified
  // Set when the config names an authorization policy file; the credentials
  // already enforce it (see authz.h).
  std::shared_ptr<AuthzPolicy> authz;
};

// Plaintext when `cfg.tls` names no certificate. INVALID_ARGUMENT naming the
// field when the block is incomplete (a key without a certificate, a CA
// without both), a file cannot be read or refresh_s is out of range.
absl::StatusOr<ListenerSecurity> MakeListenerSecurity(const config::ServerConfig& cfg);

// The metadata key that names a client on plaintext (lower case; default
// "x-indexer-client").
std::string ClientIdHeader(const config::ServerConfig& cfg);

}  // namespace indexer

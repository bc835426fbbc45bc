// Who is calling (SPEC §6, §9): the identity that namespaces a client's
// sequences and regions. Under mutual TLS it is the peer certificate's
// identity (its SAN); on a plaintext listener, the value of the configured
// metadata header (default "x-indexer-client"); empty = the anonymous
// client, whose sequences live in the shared default namespace.
#pragma once

#include <string>

#include "grpcpp/server_context.h"

namespace indexer {

// REQUIRES: `header` is a lower-case gRPC metadata key.
inline std::string ClientIdentity(const grpc::ServerContextBase& ctx,
                                  const std::string& header) {
  const std::shared_ptr<const grpc::AuthContext> auth = ctx.auth_context();
  if (auth && auth->IsPeerAuthenticated()) {
    for (const grpc::string_ref& id : auth->GetPeerIdentity()) {
      return "tls:" + std::string(id.data(), id.size());
    }
  }
  const auto& md = ctx.client_metadata();
  auto it = md.find(header);
  if (it == md.end()) return "";
  return "hdr:" + std::string(it->second.data(), it->second.size());
}

}  // namespace indexer

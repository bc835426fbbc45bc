#include "server/rpc/grpc_status.h"

#include <string>

#include "server/rpc/log_safe.h"

namespace indexer {

grpc::Status ToGrpcStatus(const absl::Status& s) {
  if (s.ok()) return grpc::Status::OK;
  // absl and gRPC share the canonical code numbering. Texts are capped: a
  // message that quotes a client's 1 MB shape must not become a 1 MB status.
  return grpc::Status(static_cast<grpc::StatusCode>(s.code()), CapText(s.message()));
}

}  // namespace indexer

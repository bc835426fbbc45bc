// The one place an absl::Status becomes a grpc::Status.
#pragma once

#include "absl/status/status.h"
#include "grpcpp/support/status.h"

namespace indexer {

grpc::Status ToGrpcStatus(const absl::Status& s);

}  // namespace indexer

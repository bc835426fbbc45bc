// The one place an absl::Status becomes a grpc::Status.
#pragma once

#include <string>

#include "absl/status/status.h"
#include "grpcpp/support/status.h"

namespace indexer {

// The message, capped (log_safe.h), and for INVALID_ARGUMENT and
// OUT_OF_RANGE whose message names a field (SPEC §6: "layer 0: q: expected
// ..."), a google.rpc.Status with a google.rpc.BadRequest field violation in
// the status details (the grpc-status-details-bin trailer), for clients
// that read errors by field rather than by text.
grpc::Status ToGrpcStatus(const absl::Status& s);

// The field a SPEC §6 message names, as a path into the request message:
// the leading "name: " parts that are field paths ("header.sequences[0].id",
// "layers[2].k", "q"), joined by "."; a Step's "layer N: " prefix becomes
// "layer". Empty when the message does not start with a field.
std::string FieldOfMessage(const std::string& message);

}  // namespace indexer

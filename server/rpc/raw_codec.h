// The service's methods are served on raw bytes (service.h): these parse a
// request, serialize a reply and finish a unary call with a status.
#pragma once

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "grpcpp/grpcpp.h"
#include "grpcpp/impl/codegen/proto_utils.h"  // SerializationTraits of protobuf messages
#include "server/rpc/grpc_status.h"

namespace indexer {

// Finishes a unary call with `s` (the one status mapping, grpc_status.h).
inline grpc::ServerUnaryReactor* Respond(grpc::CallbackServerContext* ctx, const absl::Status& s) {
  auto* reactor = ctx->DefaultReactor();
  reactor->Finish(ToGrpcStatus(s));
  return reactor;
}

// Parses a raw request: INVALID_ARGUMENT naming the expected type when the
// bytes do not decode as one.
template <typename Msg>
absl::Status Decode(const grpc::ByteBuffer& bytes, const char* type, Msg* out) {
  grpc::ByteBuffer copy(bytes);  // Deserialize consumes its buffer
  if (grpc::SerializationTraits<Msg>::Deserialize(&copy, out).ok()) return absl::OkStatus();
  return absl::InvalidArgumentError(absl::StrCat(
      "request: expected a ", type, " message; ", bytes.Length(), " bytes do not decode as one"));
}

// Serializes a reply into `out` when `s` is OK; the status to finish with.
template <typename Msg>
absl::Status Encode(absl::Status s, const Msg& msg, grpc::ByteBuffer* out) {
  if (!s.ok()) return s;
  bool own_buffer = false;
  grpc::Status gs = grpc::SerializationTraits<Msg>::Serialize(msg, out, &own_buffer);
  if (gs.ok()) return absl::OkStatus();
  return absl::InternalError(absl::StrCat("reply: ", gs.error_message()));
}

}  // namespace indexer

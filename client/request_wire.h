// Wire encoding of a layer's StepRequest with the tensor bytes as slices of
// their own, so that the client hands Q, weights and K to gRPC without
// protobuf's serializer copying them (the mirror of the daemon's
// server/rpc/reply_wire.h). Internal to the client library.
#pragma once

#include <grpcpp/support/byte_buffer.h>

#include "indexer/v1/indexer.pb.h"

namespace indexer::client {

// Encodes StepRequest{layer: *request} into `out`: the same bytes as
// protobuf's serialization of that message (fields in field-number order),
// in several slices. Tensor data of at least `min_slice_bytes` is moved out
// of `*request` into slices that own it (no copy); smaller parts are copied
// into the slices between them. Afterwards `*request` is valid but its
// moved-out data fields are unspecified. Returns false (and leaves `out`
// and `*request` untouched) when the message has fields this encoder does
// not write (unknown fields): the caller then serializes it with protobuf.
bool EncodeLayerStepRequest(v1::LayerRequest* request, grpc::ByteBuffer* out,
                            size_t min_slice_bytes = 4096);

}  // namespace indexer::client

// A skeleton reader of StepRequest wire bytes: it parses the message's
// structure with protobuf's wire primitives but leaves the `data` bytes of
// the layer's inline tensors (k, q, q_scale, weights) where gRPC received
// them, as byte ranges of the request, instead of copying each into a
// std::string. The daemon then copies each range once, straight into a
// buffer the backend lends (pinned on the gpu backend; host_buffers.h).
//
// Anything the reader does not handle (header and commit messages, a
// tensor or its data given twice, data beside a reference, groups,
// malformed bytes) takes protobuf's own parse of the whole request instead,
// so the result, and any error, is exactly the generated parser's.
// No gRPC here: the request arrives as the bytes of its slices, in order.
#pragma once

#include <cstddef>
#include <cstdint>

#include "absl/status/status.h"
#include "absl/strings/string_view.h"
#include "absl/types/span.h"
#include "indexer/v1/indexer.pb.h"

namespace indexer {

// Bytes [offset, offset + length) of the request (counted across its slices).
struct WireSpan {
  size_t offset = 0;
  size_t length = 0;
};

struct StepWire {
  // The request. With `skeleton`, it is a layer whose tensors' `data`
  // fields are empty: their bytes are in the spans below instead.
  v1::StepRequest msg;
  bool skeleton = false;
  WireSpan k, q, q_scale, weights;  // length 0: no inline bytes
};

// Reads a StepRequest from `chunks` (the request's slices, in order) into
// *out. INVALID_ARGUMENT "request: expected a StepRequest message" when the
// bytes do not parse (the generated parser's verdict).
absl::Status ReadStepRequest(absl::Span<const absl::string_view> chunks, StepWire* out);

// Copies the bytes of `span` out of `chunks` into `dst` (span.length bytes).
// REQUIRES: the span lies within the chunks (ReadStepRequest's output).
void CopySpan(absl::Span<const absl::string_view> chunks, WireSpan span, uint8_t* dst);

// The message with its spans' bytes put back into its tensors' `data`: what
// protobuf's parse gives (tests and the fuzz target compare the two).
v1::StepRequest Materialize(absl::Span<const absl::string_view> chunks, const StepWire& w);

}  // namespace indexer

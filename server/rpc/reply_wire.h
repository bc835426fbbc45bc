// Wire encoding of a layer's StepResponse around its top-k bytes, so that
// the bytes go to gRPC as a slice of their own instead of being copied by
// protobuf's serializer.
#pragma once

#include <cstddef>
#include <string>

#include "indexer/v1/indexer.pb.h"

namespace indexer {

// The bytes that precede `topk_bytes` bytes of top-k data in the encoding of
//   StepResponse{layer: reply + {topk: meta + {data: <the top-k data>}}}:
// `reply` carries LayerReply's other fields (its topk unset) and `meta` the
// Tensor's dtype and shape (its data empty). head + data parses to that
// message; it is protobuf's own encoding except that LayerReply's topk
// (field 2) follows the other fields, which parsers accept in any order.
std::string LayerReplyHead(const v1::LayerReply& reply, const v1::Tensor& meta,
                           size_t topk_bytes);

}  // namespace indexer

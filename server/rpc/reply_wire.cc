#include "server/rpc/reply_wire.h"

#include <cstdint>

#include "proto/wire_util.h"

namespace indexer {

using wire::AppendVarint;
using wire::LenTag;
using wire::VarintSize;

std::string LayerReplyHead(const v1::LayerReply& reply, const v1::Tensor& meta,
                           size_t topk_bytes) {
  const std::string reply_rest = reply.SerializeAsString();
  const std::string meta_bytes = meta.SerializeAsString();
  const size_t tensor_len = meta_bytes.size() + 1 + VarintSize(topk_bytes) + topk_bytes;
  const size_t layer_len = reply_rest.size() + 1 + VarintSize(tensor_len) + tensor_len;
  std::string head;
  head.reserve(32 + reply_rest.size() + meta_bytes.size());
  head.push_back(LenTag(1));  // StepResponse.layer
  AppendVarint(&head, layer_len);
  head += reply_rest;
  head.push_back(LenTag(2));  // LayerReply.topk
  AppendVarint(&head, tensor_len);
  head += meta_bytes;
  head.push_back(LenTag(3));  // Tensor.data
  AppendVarint(&head, topk_bytes);
  return head;
}

}  // namespace indexer

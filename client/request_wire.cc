#include "client/request_wire.h"

#include <cstdint>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include <grpcpp/support/slice.h>

#include "proto/wire_util.h"

namespace indexer::client {
namespace {

using wire::AppendVarint;
using wire::LenTag;
using wire::VarintSize;

// A slice that owns (and frees) a moved-in string.
grpc::Slice OwningSlice(std::string data) {
  auto* held = new std::string(std::move(data));
  return grpc::Slice(held->data(), held->size(),
                     [](void* p) { delete static_cast<std::string*>(p); }, held);
}

}  // namespace

bool EncodeLayerStepRequest(v1::LayerRequest* request, grpc::ByteBuffer* out,
                            size_t min_slice_bytes) {
  // The encoder writes layer (1), k (2), q (3), q_scale (4), weights (5),
  // topk_out (6), k_fp8 (7), and in each Tensor dtype (1), shape (2), data (3). Anything
  // else (unknown fields, tensors by reference: small, no bytes to spare)
  // goes through protobuf. A field added to the messages later falls back too.
  if (v1::LayerRequest::descriptor()->field_count() != 7 ||
      v1::Tensor::descriptor()->field_count() != 4 ||
      !request->GetReflection()->GetUnknownFields(*request).empty()) {
    return false;
  }
  for (const v1::Tensor* t : {&request->k(), &request->q(), &request->q_scale(),
                              &request->weights()}) {
    if (t->has_ref()) return false;
  }
  struct Field {
    int number;
    v1::Tensor* tensor;
  };
  std::vector<Field> fields;
  if (request->has_k()) fields.push_back({2, request->mutable_k()});
  if (request->has_q()) fields.push_back({3, request->mutable_q()});
  if (request->has_q_scale()) fields.push_back({4, request->mutable_q_scale()});
  if (request->has_weights()) fields.push_back({5, request->mutable_weights()});
  for (const Field& f : fields) {
    if (f.tensor->has_ref() ||
        !f.tensor->GetReflection()->GetUnknownFields(*f.tensor).empty()) {
      return false;
    }
  }
  // dtype and shape of each tensor: protobuf's own encoding of the Tensor
  // without its data (data is its last field).
  std::vector<std::string> metas;
  for (const Field& f : fields) {
    std::string data;
    data.swap(*f.tensor->mutable_data());
    metas.push_back(f.tensor->SerializeAsString());
    data.swap(*f.tensor->mutable_data());
  }
  const size_t layer_len = request->ByteSizeLong();

  std::vector<grpc::Slice> slices;
  std::string pending;  // bytes not yet in a slice
  pending.reserve(64);
  pending.push_back(LenTag(2));  // StepRequest.layer
  AppendVarint(&pending, layer_len);
  if (request->layer() != 0) {
    pending.push_back(static_cast<char>(1 << 3));  // LayerRequest.layer, varint
    AppendVarint(&pending, request->layer());
  }
  for (size_t i = 0; i < fields.size(); ++i) {
    std::string& data = *fields[i].tensor->mutable_data();
    const size_t n = data.size();
    const size_t body = metas[i].size() + (n == 0 ? 0 : 1 + VarintSize(n) + n);
    pending.push_back(LenTag(fields[i].number));
    AppendVarint(&pending, body);
    pending += metas[i];
    if (n == 0) continue;
    pending.push_back(LenTag(3));  // Tensor.data
    AppendVarint(&pending, n);
    if (n < min_slice_bytes) {
      pending += data;
      continue;
    }
    slices.emplace_back(pending);
    pending.clear();
    slices.push_back(OwningSlice(std::move(data)));
    data.clear();
  }
  if (request->has_topk_out()) {
    const std::string ref = request->topk_out().SerializeAsString();
    pending.push_back(LenTag(6));  // LayerRequest.topk_out
    AppendVarint(&pending, ref.size());
    pending += ref;
  }
  if (request->k_fp8() != 0) {
    pending.push_back(static_cast<char>(7 << 3));  // LayerRequest.k_fp8, varint, last field
    AppendVarint(&pending, static_cast<uint64_t>(request->k_fp8()));
  }
  if (!pending.empty()) slices.emplace_back(pending);
  *out = grpc::ByteBuffer(slices.data(), slices.size());
  return true;
}

}  // namespace indexer::client

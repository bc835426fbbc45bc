#include "server/rpc/inline_tensors.h"

#include <memory>
#include <utility>

#include "absl/strings/str_cat.h"

namespace indexer {

absl::string_view InlineTensors::Staged::View() const {
  if (lease) return {reinterpret_cast<const char*>(lease.data()), length};
  return copy;
}

absl::Status InlineTensors::Read(const grpc::ByteBuffer& bytes, v1::StepRequest* req) {
  for (Staged& s : staged_) {
    s.lease.Reset();
    s.copy.clear();
    s.length = 0;
  }
  topk_.Reset();
  in_lent_ = in_copied_ = out_lent_ = out_copied_ = 0;
  // The slices are references to gRPC's received bytes (no copy).
  std::vector<grpc::Slice> slices;
  std::vector<absl::string_view> chunks;
  // (An invalid buffer fails as gRPC's deserialization failed it.)
  if (!bytes.Valid() || !bytes.Dump(&slices).ok()) {
    return absl::InvalidArgumentError("request: expected a StepRequest message");
  }
  chunks.reserve(slices.size());
  for (const grpc::Slice& s : slices) {
    chunks.emplace_back(reinterpret_cast<const char*>(s.begin()), s.size());
  }
  absl::Status st = ReadStepRequest(chunks, &wire_);
  if (!st.ok()) return st;
  if (!wire_.skeleton && wire_.msg.has_layer()) {
    // protobuf's parse (an unusual layer): its tensors were copied into
    // the message.
    const v1::LayerRequest& l = wire_.msg.layer();
    for (const v1::Tensor* t : {&l.k(), &l.q(), &l.q_scale(), &l.weights()}) {
      in_copied_ += static_cast<int64_t>(t->data().size());
    }
  }
  const WireSpan spans[4] = {wire_.k, wire_.q, wire_.q_scale, wire_.weights};
  for (int i = 0; i < 4; ++i) {
    const WireSpan sp = spans[i];
    if (sp.length == 0) continue;
    Staged& s = staged_[i];
    s.length = sp.length;
    s.lease = pool_->Lend(static_cast<int64_t>(sp.length));
    uint8_t* dst = s.lease.data();
    if (dst == nullptr) {
      s.copy.resize(sp.length);
      dst = reinterpret_cast<uint8_t*>(s.copy.data());
    }
    CopySpan(chunks, sp, dst);
    (s.lease ? in_lent_ : in_copied_) += static_cast<int64_t>(sp.length);
  }
  if (in_lent_ > 0) metrics_->InlineTensorBytes(true, true, in_lent_);
  if (in_copied_ > 0) metrics_->InlineTensorBytes(true, false, in_copied_);
  req->Swap(&wire_.msg);
  return absl::OkStatus();
}

void InlineTensors::Apply(LayerInput* in) {
  if (staged_[0].length > 0) in->k.data = staged_[0].View();
  if (staged_[1].length > 0) in->q.data = staged_[1].View();
  if (staged_[2].length > 0) in->q_scale.data = staged_[2].View();
  if (staged_[3].length > 0) in->weights.data = staged_[3].View();
  in->out_lease = &topk_;
}

bool InlineTensors::TakeTopk(grpc::Slice* slice) {
  for (Staged& s : staged_) {
    s.lease.Reset();
    s.copy.clear();
    s.length = 0;
  }
  if (!topk_) return false;
  const size_t n = static_cast<size_t>(topk_.size());
  auto* held = new HostLease(std::move(topk_));
  out_lent_ = static_cast<int64_t>(n);
  metrics_->InlineTensorBytes(false, true, out_lent_);
  *slice = grpc::Slice(held->data(), n, [](void* p) { delete static_cast<HostLease*>(p); },
                       held);
  return true;
}

void InlineTensors::CopiedTopk(size_t n) {
  out_copied_ = static_cast<int64_t>(n);
  if (n > 0) metrics_->InlineTensorBytes(false, false, out_copied_);
}

std::string InlineTensors::Describe() const {
  return absl::StrCat("inline in ", in_lent_, " B lent, ", in_copied_, " B copied; out ",
                      out_lent_, " B lent, ", out_copied_, " B copied; pool ",
                      pool_->Describe());
}

}  // namespace indexer

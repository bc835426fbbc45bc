// The inline-bytes path of a Step stream's layers: the request is read by
// the skeleton reader (step_wire.h), each inline tensor's bytes are copied
// once from gRPC's received slices into a buffer the backend lends
// (host_buffers.h; pinned on the gpu backend, whose upload then reads it
// directly), and the layer's top-k lands in a lent buffer that the reply
// sends as its own slice. When the pool has no room a tensor is copied into
// ordinary memory instead (and the gpu backend stages it as before).
//
// One per StepReactor; used by one thread at a time (the reactor's).
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "grpcpp/support/byte_buffer.h"
#include "grpcpp/support/slice.h"
#include "indexer/v1/indexer.pb.h"
#include "kernels/host_buffers.h"
#include "server/core/engine.h"
#include "server/core/metrics.h"
#include "server/rpc/step_wire.h"

namespace indexer {

class InlineTensors {
 public:
  InlineTensors(HostBufferPool* pool, Metrics* metrics) : pool_(pool), metrics_(metrics) {}

  // Reads `bytes` into *req: the StepRequest, with a layer's inline tensor
  // data already copied into lent (or, without room, owned) buffers instead
  // of into *req. INVALID_ARGUMENT "request: expected a StepRequest
  // message" when the bytes do not parse. Drops the previous request's
  // buffers.
  absl::Status Read(const grpc::ByteBuffer& bytes, v1::StepRequest* req);

  // Points the layer's inline tensors (converted from *req by ToLayerInput,
  // their data empty) at the copied bytes, and asks for the top-k in a lent
  // buffer (LayerInput::out_lease). REQUIRES: Read of this layer first.
  void Apply(LayerInput* in);

  // The top-k bytes as one slice when they landed in a lent buffer (the
  // slice then owns it), else false: the caller sends its own bytes. Also
  // gives the layer's input buffers back (REQUIRES: the layer has run), so
  // that a stream waiting for its next message holds none.
  bool TakeTopk(grpc::Slice* slice);
  // Counts top-k bytes the reply sends from the caller's own buffer.
  void CopiedTopk(size_t n);

  // What this layer's bytes took, for the daemon's per-layer debug line:
  // "inline in 1048576 B lent, 0 B copied; out 16384 B lent, 0 B copied;
  // pool heap, at most 16 buffers / 256 MiB; 3 buffers (1 lent), 1040 KiB".
  std::string Describe() const;

 private:
  struct Staged {
    HostLease lease;   // the bytes, when lent
    std::string copy;  // else here
    size_t length = 0;
    absl::string_view View() const;
  };

  HostBufferPool* pool_;
  Metrics* metrics_;
  StepWire wire_;
  Staged staged_[4];  // k, q, q_scale, weights
  HostLease topk_;
  int64_t in_lent_ = 0, in_copied_ = 0, out_lent_ = 0, out_copied_ = 0;
};

}  // namespace indexer

// Wire messages (indexer.v1) to the core's types, with the checks that
// belong to the wire: field names in errors are the request's own. No gRPC
// here: the service calls these, and so do the fuzz targets, which drive
// decode -> validate -> engine without a transport.
#pragma once

#include <cstdint>
#include <string>
#include <utility>
#include <vector>

#include "absl/status/statusor.h"
#include "indexer/v1/indexer.pb.h"
#include "server/core/engine.h"
#include "server/core/regions.h"
#include "server/core/tensor.h"

namespace indexer {

// A borrowed view of `t`'s inline bytes. REQUIRES: `t` outlives the view.
TensorView ViewOf(bool present, const v1::Tensor& t);

// `field` names the id in errors ("ids[3]"); `ns` is the caller's namespace.
absl::StatusOr<SeqName> ToSeqName(const std::string& field, const v1::SequenceId& id,
                                  const std::string& ns = "");

absl::StatusOr<StepSpec> ToStepSpec(const v1::StepHeader& h, const std::string& ns = "");

// Views of the layer's tensors; `out_bytes` unset. Inline bytes only: a
// tensor given by reference shows as having no bytes (the shape check then
// rejects it); the service uses the form below.
LayerInput ToLayerInput(const v1::LayerRequest& r);

// Where a layer's references resolve: the registry and the caller who owns
// them. The pins of every resolved reference are appended to `pins`; the
// caller holds them until the layer's reply is written.
struct RegionResolver {
  RegionRegistry* registry = nullptr;  // null: every reference is refused
  std::string owner;
  std::vector<PinnedRegion>* pins = nullptr;
};

// A view of `t` (`field` names it in errors): its inline bytes, or the
// bytes of the region its `ref` names. INVALID_ARGUMENT for a ref together
// with inline data; the registry's errors for the ref ("q.ref.region: ...").
// The ref's byte count against shape x dtype is ExpectTensor's check later
// (the view's data is the ref's bytes). A device region gives a view with
// on_device set over device memory.
absl::StatusOr<TensorView> ViewOf(const std::string& field, bool present,
                                  const v1::Tensor& t, const RegionResolver& regions);

// Views of the layer's tensors with references resolved, and topk_out when
// set (its byte count is checked by the engine against the layer's top-k).
absl::StatusOr<LayerInput> ToLayerInput(const v1::LayerRequest& r,
                                        const RegionResolver& regions);

absl::StatusOr<std::vector<SeqName>> ToReleaseNames(const v1::ReleaseRequest& req,
                                                    const std::string& ns = "");

struct ImportArgs {
  SeqName name;
  bool create = false;
  int64_t num_tokens = 0;
  std::vector<std::pair<int32_t, TensorView>> layers;  // views into the request
};
// INVALID_ARGUMENT unless 1 <= num_tokens <= max_q_len.
absl::StatusOr<ImportArgs> ToImport(const v1::WriteEntriesRequest& req, int64_t max_q_len,
                                    const std::string& ns = "");

// ExportEntries (lifecycle): the request's checks against the daemon's
// max_message_bytes and max_q_len, with its 0 = default rules resolved.
struct ExportArgs {
  SeqName name;
  int64_t max_message_bytes = 0;  // largest message to send
  int64_t max_tokens = 0;         // tokens per message at most
};
absl::StatusOr<ExportArgs> ToExport(const v1::ExportEntriesRequest& req,
                                    int64_t daemon_max_message_bytes, int64_t max_q_len,
                                    const std::string& ns = "");

// Bytes of an exported WriteEntriesRequest besides its entries' data, at
// most: the id (256-byte names), create, num_tokens and, per layer, the
// LayerEntries and Tensor framing (tags, lengths, layer, dtype, 2-D shape).
int64_t ExportFramingBytes(int32_t num_layers);

// The WriteEntriesRequest of one exported chunk of sequence `id`: create on
// the first chunk, every layer's entries as [n_new, VB + SB] UINT8 (moved
// out of `chunk`).
v1::WriteEntriesRequest ExportMessage(const Model& model, const v1::SequenceId& id,
                                      SequenceExport::Chunk& chunk);

}  // namespace indexer

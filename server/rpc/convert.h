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
#include "server/core/tensor.h"

namespace indexer {

// A borrowed view of `t`'s inline bytes. REQUIRES: `t` outlives the view.
TensorView ViewOf(bool present, const v1::Tensor& t);

// `field` names the id in errors ("ids[3]"); `ns` is the caller's namespace.
absl::StatusOr<SeqName> ToSeqName(const std::string& field, const v1::SequenceId& id,
                                  const std::string& ns = "");

absl::StatusOr<StepSpec> ToStepSpec(const v1::StepHeader& h, const std::string& ns = "");

// Views of the layer's tensors; `out_bytes` unset.
LayerInput ToLayerInput(const v1::LayerRequest& r);

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

}  // namespace indexer

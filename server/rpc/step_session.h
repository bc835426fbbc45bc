// One client's step, without a transport: the step logic that the gRPC Step
// stream (service.cc's StepReactor) and a request ring (ring_host.h) share.
// The transport parses each StepRequest, hands the parsed message here and
// writes what comes back (a layer's reply and top-k bytes, the commit's
// sequence lengths); owner checks, quotas, the engine's step and the
// layer metrics live here.
//
// Thread safety: not thread-safe; one transport thread at a time (the
// reactor's and the ring's own ordering guarantee it).
#pragma once

#include <chrono>
#include <memory>
#include <string>
#include <vector>

#include "absl/functional/function_ref.h"
#include "absl/status/statusor.h"
#include "indexer/v1/indexer.pb.h"
#include "server/core/engine.h"
#include "server/core/metrics.h"
#include "server/core/regions.h"
#include "server/rpc/quota.h"

namespace indexer {

// What a step needs from the service (all owned by it and outliving every
// session).
struct StepServices {
  Engine* engine = nullptr;
  Metrics* metrics = nullptr;
  ClientQuotas* quotas = nullptr;
  RegionRegistry* regions = nullptr;
};

// When the transport had a message (the layer reply's timings).
struct StepReceipt {
  std::chrono::steady_clock::time_point read_posted;  // the transport began waiting for it
  std::chrono::steady_clock::time_point received;     // the message was whole
  std::chrono::steady_clock::time_point parsed;       // its parse was done
};

// A layer's answer: the transport writes `reply` + `meta` + the first
// topk->size() bytes of `topk` as StepResponse{layer} (LayerReplyHead).
struct StepLayerResult {
  v1::LayerReply reply;                // topk unset
  v1::Tensor meta;                     // the top-k's dtype and shape, data empty
  std::unique_ptr<std::string> topk;   // empty when written to topk_out
};

class StepSession {
 public:
  using Clock = std::chrono::steady_clock;

  // `client`: namespace and quota key (ClientIdentity); `owner`: owner of
  // the regions its layers may reference; `peer` for debug logs;
  // `created`: the transport's start (LayerTimings.stream_clock_ns).
  StepSession(const StepServices& services, std::string client, std::string owner,
              std::string peer, Clock::time_point created);
  // An open step still here rolls back (nothing counted: see Reset).
  ~StepSession() = default;

  bool has_step() const { return step_ != nullptr; }
  bool committed() const { return committed_; }
  // The open step's id (escaped, for logs), "" without one.
  std::string LogId() const;
  // For log lines: the step's id, else "step".
  std::string Who() const;

  // Opens the step (the header). FAILED_PRECONDITION when one is open;
  // quota and engine errors as BeginStep gives them, nothing held then.
  absl::Status Begin(const v1::StepHeader& h, const StepReceipt& receipt);
  // Runs a layer; `buffer` (any string, reused) receives the top-k unless
  // the request names topk_out. The layer's regions stay pinned until
  // ReleasePins or the next Layer.
  // `adjust`, when given, sees the converted input before it runs (the
  // Step stream's inline path points the tensors at lent buffers there).
  absl::StatusOr<StepLayerResult> Layer(const v1::LayerRequest& r, const StepReceipt& receipt,
                                        std::unique_ptr<std::string> buffer,
                                        absl::FunctionRef<void(LayerInput*)> adjust = [](LayerInput*) {});
  // Commits the open step; on success committed() is true.
  absl::StatusOr<v1::StepCommitted> Commit();

  // A new start for the next step's timings (a ring's transport has no
  // stream per step: it passes the header's receipt).
  void set_created(Clock::time_point t) { created_ = t; }

  // The layer's regions may be unmapped from now on (its reply is out).
  void ReleasePins() { pins_.clear(); }
  // Drops the step (rolled back unless committed), its quota and pins, and
  // makes the session ready for a new header. Counts nothing: the caller
  // counts the outcome (Metrics::StepEnded) first where it wants to.
  void Reset();

 private:
  StepServices s_;
  const std::string client_;
  const std::string owner_;
  const std::string peer_;
  Clock::time_point created_;
  std::vector<PinnedRegion> pins_;  // regions of the layer in flight
  ClientQuotas::Hold step_hold_;    // open step + its pages
  std::unique_ptr<indexer::Step> step_;
  Clock::time_point header_at_;
  double begin_us_ = 0;
  bool start_reported_ = false;  // the first layer reply carried the above
  bool committed_ = false;
};

}  // namespace indexer

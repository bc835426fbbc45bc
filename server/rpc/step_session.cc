#include "server/rpc/step_session.h"

#include <utility>

#include "absl/cleanup/cleanup.h"
#include "absl/strings/str_cat.h"
#include "kernels/common/status_macros.h"
#include "server/rpc/convert.h"
#include "server/rpc/log_safe.h"
#include "spdlog/spdlog.h"

namespace indexer {
namespace {

using Clock = StepSession::Clock;

double MicrosBetween(Clock::time_point a, Clock::time_point b) {
  return std::chrono::duration<double, std::micro>(b - a).count();
}

// libstdc++'s steady_clock is CLOCK_MONOTONIC: a client on this host reads
// the same clock (LayerTimings.received_clock_ns).
int64_t MonotonicNs(Clock::time_point t) {
  return std::chrono::duration_cast<std::chrono::nanoseconds>(t.time_since_epoch()).count();
}

}  // namespace

StepSession::StepSession(const StepServices& services, std::string client, std::string owner,
                         std::string peer, Clock::time_point created)
    : s_(services),
      client_(std::move(client)),
      owner_(std::move(owner)),
      peer_(std::move(peer)),
      created_(created) {}

std::string StepSession::LogId() const {
  return step_ ? LogSafe(step_->id(), 128) : std::string();
}

std::string StepSession::Who() const {
  return step_ ? LogSafe(step_->id(), 128) : std::string("step");
}

void StepSession::Reset() {
  step_.reset();
  step_hold_.Reset();
  pins_.clear();
  committed_ = false;
  start_reported_ = false;
  begin_us_ = 0;
}

absl::Status StepSession::Begin(const v1::StepHeader& h, const StepReceipt& receipt) {
  if (step_) {
    return absl::FailedPreconditionError("header: already received; expected layer or commit");
  }
  // Sequences live in the client's namespace (SPEC §6 "Clients and
  // tenancy"): another client's sequence is simply not found.
  header_at_ = receipt.received;
  const absl::Cleanup timed = [&] { begin_us_ = MicrosBetween(header_at_, Clock::now()); };
  ASSIGN_OR_RETURN(StepSpec spec, ToStepSpec(h, client_));
  if (absl::Status open = s_.quotas->OpenStep(client_, &step_hold_); !open.ok()) {
    s_.metrics->Rejected(Rejection::kQuota);
    return open;
  }
  ASSIGN_OR_RETURN(std::unique_ptr<indexer::Step> step, s_.engine->BeginStep(spec));
  absl::Status reserved = s_.quotas->ReservePages(step->reserved_pages(), &step_hold_);
  if (!reserved.ok()) {
    s_.metrics->Rejected(Rejection::kQuota);
    return reserved;  // ~Step rolls back: the pages are free again
  }
  step_ = std::move(step);
  if (spdlog::should_log(spdlog::level::debug)) {
    const indexer::Step::BeginTimes& bt = step_->begin_times();
    const std::string parts = step_->PrepareParts();
    spdlog::debug("[{}] begin: {} sequences, {} rows, client {}, peer {}; after receipt: "
                  "parsed {:.1f} us, then admission {:.1f} us, rows {:.1f} us, backend prepare "
                  "{:.1f} us{}{}; handled {:.1f} us",
                  Who(), spec.seqs.size(), step_->num_rows(), ClientQuotas::Display(client_),
                  LogSafe(peer_, 128), MicrosBetween(header_at_, receipt.parsed), bt.admit_us,
                  bt.rows_us, bt.prepare_us, parts.empty() ? "" : " = ", parts,
                  MicrosBetween(header_at_, Clock::now()));
  }
  return absl::OkStatus();
}

absl::StatusOr<StepLayerResult> StepSession::Layer(const v1::LayerRequest& r,
                                                   const StepReceipt& receipt,
                                                   std::unique_ptr<std::string> buffer,
                                                   absl::FunctionRef<void(LayerInput*)> adjust) {
  if (!step_) return absl::FailedPreconditionError("layer: expected the header first");
  // References pin their regions in pins_ until the reply is written.
  pins_.clear();
  auto converted = ToLayerInput(r, RegionResolver{s_.regions, owner_, &pins_});
  if (!converted.ok()) {
    return absl::Status(converted.status().code(),
                        absl::StrCat("layer ", r.layer(), ": ", converted.status().message()));
  }
  LayerInput& in = *converted;
  adjust(&in);
  // The backend writes the indices straight into the reply buffer, which
  // goes out as it is, or into the caller's topk_out region (the reply then
  // carries dtype and shape only).
  StepLayerResult res;
  res.topk = std::move(buffer);
  if (in.out_device != nullptr || in.out_host != nullptr) {
    res.topk->clear();
  } else {
    in.out_bytes = res.topk.get();
  }
  const Clock::time_point start = Clock::now();
  auto out = step_->RunLayer(in);
  if (!out.ok()) {
    return absl::Status(out.status().code(),
                        absl::StrCat("layer ", r.layer(), ": ", out.status().message()));
  }
  v1::LayerReply& reply = res.reply;
  reply.set_layer(r.layer());
  v1::LayerTimings* tm = reply.mutable_timings();
  tm->set_queue_us(MicrosBetween(receipt.received, start));
  tm->set_validate_us(out->validate_us);
  tm->set_write_us(out->timings.write_us);
  tm->set_logits_us(out->timings.logits_us);
  tm->set_topk_us(out->timings.topk_us);
  tm->set_enqueue_us(out->timings.enqueue_us);
  tm->set_wait_us(out->timings.wait_us);
  const Clock::time_point replied = Clock::now();
  tm->set_total_us(MicrosBetween(receipt.received, replied));
  tm->set_received_clock_ns(MonotonicNs(receipt.received));
  tm->set_replied_clock_ns(MonotonicNs(replied));
  tm->set_read_clock_ns(MonotonicNs(receipt.read_posted));
  if (!start_reported_) {
    start_reported_ = true;
    tm->set_stream_clock_ns(MonotonicNs(created_));
    tm->set_header_clock_ns(MonotonicNs(header_at_));
    tm->set_begin_us(begin_us_);
  }
  s_.metrics->LayerDone(s_.engine->model().layer_role[r.layer()].kind,
                        {tm->queue_us(), tm->validate_us(), tm->write_us(), tm->logits_us(),
                         tm->topk_us(), tm->total_us()});
  res.meta.set_dtype(v1::INT32);
  for (int64_t d : out->shape) res.meta.add_shape(d);
  return res;
}

absl::StatusOr<v1::StepCommitted> StepSession::Commit() {
  if (!step_) return absl::FailedPreconditionError("commit: expected the header first");
  ASSIGN_OR_RETURN(std::vector<int64_t> lens, step_->Commit());
  v1::StepCommitted committed;
  for (int64_t l : lens) committed.add_seq_lens(static_cast<uint64_t>(l));
  spdlog::debug("[{}] committed", Who());
  committed_ = true;
  return committed;
}

}  // namespace indexer

#include "server/rpc/service.h"

#include <chrono>
#include <random>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "absl/strings/escaping.h"
#include "absl/strings/str_cat.h"
#include "absl/synchronization/mutex.h"
#include "grpcpp/support/proto_buffer_reader.h"
#include "grpcpp/support/proto_buffer_writer.h"
#include "kernels/common/status_macros.h"
#include "server/rpc/convert.h"
#include "server/rpc/credentials.h"
#include "server/rpc/executor.h"
#include "server/rpc/grpc_status.h"
#include "server/rpc/identity.h"
#include "server/rpc/idle_watch.h"
#include "server/rpc/inline_tensors.h"
#include "server/rpc/lifecycle_service.h"
#include "server/rpc/log_safe.h"
#include "server/rpc/peer_uid.h"
#include "server/rpc/quota.h"
#include "server/rpc/raw_codec.h"
#include "server/rpc/reply_wire.h"
#include "server/rpc/request_log.h"
#include "server/rpc/ring_host.h"
#include "server/rpc/step_session.h"
#include "spdlog/spdlog.h"

#ifndef INDEXER_VERSION
#define INDEXER_VERSION "0.0.0"
#endif
#ifndef INDEXER_BUILD
#define INDEXER_BUILD "unknown"
#endif

namespace indexer {
namespace {

using Clock = std::chrono::steady_clock;

double MicrosBetween(Clock::time_point a, Clock::time_point b) {
  return std::chrono::duration<double, std::micro>(b - a).count();
}

// 128 random bits as 32 hex digits: new at every start, so that a client
// tells a restarted daemon (its sequences gone) from the one it knew.
std::string NewInstanceId() {
  std::random_device rd;
  std::string id;
  for (int i = 0; i < 4; ++i) absl::StrAppend(&id, absl::Hex(rd(), absl::kZeroPad8));
  return id;
}

int64_t UnixMillisNow() {
  return std::chrono::duration_cast<std::chrono::milliseconds>(
             std::chrono::system_clock::now().time_since_epoch())
      .count();
}

}  // namespace

struct ServiceState {
  ServiceState(Engine* e, std::shared_ptr<ReplyBuffers> b);

  Engine* engine;
  Metrics& metrics;  // the engine's
  // The metadata key naming a plaintext client (credentials.h).
  std::string client_header;
  RegionRegistry regions;
  MemfdTokens memfd_tokens;
  std::shared_ptr<ReplyBuffers> buffers;  // reply slices hold it too
  ClientQuotas quotas;
  RateLimiter rejection_log;  // repeated RESOURCE_EXHAUSTED: once a second
  IdleWatch idle_watch;
  // Request rings: their workers use the above, so they stop before them.
  std::unique_ptr<RingHost> rings;
  Executor executor;  // last: its workers stop first

  // A client's identity (identity.h): its sequence namespace and quota key.
  std::string Client(const grpc::CallbackServerContext& ctx) const {
    return ClientIdentity(ctx, client_header);
  }
  // Who owns a region: the identity, else the registering connection.
  std::string Owner(const grpc::CallbackServerContext& ctx) const {
    std::string id = Client(ctx);
    return id.empty() ? "peer:" + ctx.peer() : id;
  }
  // What StepSessions use.
  StepServices StepDeps() { return StepServices{engine, &metrics, &quotas, &regions}; }

  // Logs a rejected call: once a second for RESOURCE_EXHAUSTED (admission
  // and quotas, which a flood repeats), counting the rest; else every time.
  void LogRejection(const std::string& who, const absl::Status& s) {
    if (s.code() == absl::StatusCode::kResourceExhausted) {
      int64_t suppressed = 0;
      if (!rejection_log.Allow(&suppressed)) return;
      spdlog::warn("[{}] {}: {}{}", who, absl::StatusCodeToString(s.code()), CapText(s.message()),
                   suppressed > 0 ? absl::StrCat(" (and ", suppressed,
                                                 " similar rejections in the last second)")
                                  : std::string());
      return;
    }
    // Client text inside messages (names, identities) is escaped where it
    // enters them (SeqName, ClientQuotas::Display); the length is capped here.
    spdlog::warn("[{}] {}: {}", who, absl::StatusCodeToString(s.code()), CapText(s.message()));
  }
};

namespace {

std::vector<int64_t> GroupPages(const Engine& e) {
  std::vector<int64_t> out;
  for (const GroupSpec& g : e.model().groups) out.push_back(g.pages);
  return out;
}

std::vector<std::string> GroupNames(const Engine& e) {
  std::vector<std::string> out;
  for (const GroupSpec& g : e.model().groups) out.push_back(g.name);
  return out;
}

QuotaLimits LimitsOf(const config::ServerConfig& c) {
  return {static_cast<int64_t>(c.client_quota().max_open_steps()),
          static_cast<int64_t>(c.client_quota().max_reserved_pct()),
          static_cast<int64_t>(c.client_quota().max_bytes_in_flight_mb()) << 20};
}

}  // namespace

// Top-k byte buffers of layer replies, shared by the service's Step streams.
// gRPC holds a reply's buffer (as a slice) until the transport no longer
// needs it, which may be after the write completed; the slice's destructor
// then returns the buffer here, so buffers are reused (and, at the previous
// size, not zero-filled again) from layer to layer and step to step.
class ReplyBuffers : public std::enable_shared_from_this<ReplyBuffers> {
 public:
  std::unique_ptr<std::string> Take() {
    absl::MutexLock lock(&mu_);
    if (free_.empty()) return std::make_unique<std::string>();
    std::unique_ptr<std::string> b = std::move(free_.back());
    free_.pop_back();
    return b;
  }

  // A slice over `*buf` (its first `bytes`) that gives the buffer back when
  // gRPC releases it.
  grpc::Slice Lend(std::unique_ptr<std::string> buf, size_t bytes) {
    char* data = buf->data();
    auto* held = new Held{shared_from_this(), std::move(buf)};
    return grpc::Slice(data, bytes, &ReplyBuffers::Release, held);
  }

 private:
  struct Held {
    std::shared_ptr<ReplyBuffers> owner;
    std::unique_ptr<std::string> buf;
  };
  static void Release(void* p) {
    std::unique_ptr<Held> held(static_cast<Held*>(p));
    absl::MutexLock lock(&held->owner->mu_);
    // Kept: about two per concurrently open step (one in flight, one being
    // filled), up to kKeep.
    if (held->owner->free_.size() < kKeep) held->owner->free_.push_back(std::move(held->buf));
  }

  static constexpr size_t kKeep = 8;
  absl::Mutex mu_;
  std::vector<std::unique_ptr<std::string>> free_;
};

namespace {

// One Step stream: header, layers, commit. Messages are handled one at a
// time (read, work, write, read ...): gRPC's thread receives a message and
// checks the client's bytes in flight, the service's executor parses it,
// runs it and starts the reply (or the next read). The open Step rolls back
// when the stream ends uncommitted: errors, cancellation, lost clients, and
// a stream that waits for a message longer than step_idle_ms.
//
// Threads: at most one of a gRPC callback, an executor task and the idle
// watch touches the step at a time: the watch acts only while a read is
// pending (no task can be running), and mu_ orders it against OnReadDone.
class StepReactor final
    : public grpc::ServerBidiReactor<grpc::ByteBuffer, grpc::ByteBuffer>,
      public IdleWatched {
 public:
  StepReactor(ServiceState* state, grpc::CallbackServerContext* ctx)
      : state_(state),
        ctx_(ctx),
        buffers_(state->buffers),
        client_(state->Client(*ctx)),
        created_(Clock::now()),
        tag_(TagOf(*ctx)),
        inline_(&state->engine->backend().host_buffers(), &state->metrics),
        session_(state->StepDeps(), client_, state->Owner(*ctx), ctx->peer(), created_) {
    state_->idle_watch.Add(this);
    ReadNext();
  }

  void OnReadDone(bool ok) override {
    {
      absl::MutexLock lock(&mu_);
      reading_ = false;
      if (finished_) return;  // ended by the idle watch
    }
    if (!ok) {
      // Half-close or cancellation before commit.
      if (session_.has_step()) spdlog::info("[{}] closed before commit: rolled back", Who());
      End(grpc::Status(grpc::StatusCode::ABORTED,
                       "step: stream closed before commit; rolled back"));
      return;
    }
    // Receipt: the message is whole. Its parse is part of the layer's queue
    // and total times, so that what the client sees outside the server is
    // the transport alone.
    received_ = Clock::now();
    state_->metrics.BytesIn(static_cast<int64_t>(req_bytes_.Length()));
    absl::Status s =
        state_->quotas.TakeBytes(client_, static_cast<int64_t>(req_bytes_.Length()), &bytes_hold_);
    if (!s.ok()) {
      state_->metrics.Rejected(Rejection::kQuota);
      Reject(s);
      return;
    }
    state_->executor.Post([this] { Process(); });
  }

  void OnWriteDone(bool ok) override {
    // The layer's reply is out: its regions may be unmapped from now on.
    session_.ReleasePins();
    {
      absl::MutexLock lock(&mu_);
      writing_ = false;
      if (finished_) return;  // ended by the idle watch
    }
    if (!ok) {
      End(grpc::Status(grpc::StatusCode::CANCELLED, "step: reply not delivered"));
      return;
    }
    if (session_.committed()) {
      End(grpc::Status::OK);
      return;
    }
    ReadNext();
  }

  void OnDone() override {
    state_->idle_watch.Remove(this);
    // A cancelled stream ends here without End().
    if (session_.has_step() && !session_.committed()) {
      state_->metrics.StepEnded(StepOutcome::kAborted);
      LogEnd(grpc::Status(grpc::StatusCode::CANCELLED, ""));
    }
    session_.Reset();
    delete this;
  }

  // The watch's thread only claims the end; the rollback and Finish run on
  // the executor, outside the watch's lock (Finish may run OnDone inline,
  // which takes that lock).
  // A client that stops taking replies is idle too: its write never
  // completes, and the step would hold its pages for as long as the
  // connection lives. The rollback does not wait for that write (gRPC
  // sends the status once the transport can).
  void ExpireIfIdleSince(Clock::time_point deadline) override {
    absl::MutexLock lock(&mu_);
    if (finished_) return;
    const bool read_idle = reading_ && read_since_ <= deadline;
    const bool write_idle = writing_ && write_since_ <= deadline;
    if (!read_idle && !write_idle) return;
    finished_ = true;
    state_->executor.Post([this, read_idle] {
      const int64_t ms = state_->idle_watch.idle().count();
      if (session_.has_step()) spdlog::info("[{}] idle for {} ms: rolled back", Who(), ms);
      Close(grpc::Status(
          grpc::StatusCode::DEADLINE_EXCEEDED,
          absl::StrCat(read_idle ? "step: no message for " : "step: reply not taken for ", ms,
                       " ms (step_idle_ms = ", ms, "); the step was rolled back")));
    });
  }

 private:
  enum class Next { kRead, kWrite };

  // Executor: parse, run, then reply or read on.
  void Process() {
    absl::StatusOr<Next> next = [&]() -> absl::StatusOr<Next> {
      // [inline] Parse into req_, a layer's inline tensors copied once out
      // of the transport's slices into lent buffers (inline_tensors.h).
      absl::Status parsed = inline_.Read(req_bytes_, &req_);
      req_bytes_.Clear();
      parsed_ = Clock::now();
      RETURN_IF_ERROR(parsed);
      return Handle();
    }();
    // The request is handled: its bytes no longer count against the client.
    bytes_hold_.Reset();
    if (!next.ok()) {
      Reject(next.status());
    } else if (*next == Next::kWrite) {
      {
        absl::MutexLock lock(&mu_);
        writing_ = true;
        write_since_ = Clock::now();
      }
      StartWrite(&resp_bytes_);
    } else {
      ReadNext();
    }
  }

  void ReadNext() {
    {
      absl::MutexLock lock(&mu_);
      reading_ = true;
      read_since_ = Clock::now();
      read_posted_ = read_since_;
    }
    StartRead(&req_bytes_);
  }

  std::string Who() const { return session_.Who(); }

  void Reject(const absl::Status& s) {
    state_->LogRejection(Who(), s);
    End(ToGrpcStatus(s));
  }

  // Rolls back (unless committed) before the client can see the final
  // status, so a client that retries at once finds its sequences free.
  void End(const grpc::Status& status) {
    {
      absl::MutexLock lock(&mu_);
      if (finished_) return;
      finished_ = true;
    }
    Close(status);
  }

  // REQUIRES: this thread set finished_ (so nothing else touches the step).
  void Close(const grpc::Status& status) {
    if (session_.has_step()) state_->metrics.StepEnded(Outcome(status));
    LogEnd(status);
    session_.Reset();  // the failed layer writes nothing after this
    Finish(status);
  }

  // The call's access line (request_log.h), the step's id as request id.
  void LogEnd(const grpc::Status& status) const {
    const std::string id = session_.LogId();
    LogCall("/indexer.v1.Indexer/Step", tag_, id, ClientQuotas::Display(client_), status,
            MicrosBetween(created_, Clock::now()) / 1e3);
  }

  // A committed step stays committed whatever happens to its reply; the
  // reactor ends a step the client gave up on with ABORTED (closed before
  // commit) or CANCELLED (reply not delivered); any other status failed it.
  StepOutcome Outcome(const grpc::Status& status) const {
    if (session_.committed()) return StepOutcome::kCommitted;
    if (status.error_code() == grpc::StatusCode::ABORTED ||
        status.error_code() == grpc::StatusCode::CANCELLED) {
      return StepOutcome::kAborted;
    }
    return StepOutcome::kFailed;
  }

  absl::StatusOr<Next> Handle() {
    switch (req_.kind_case()) {
      case v1::StepRequest::kHeader:
        RETURN_IF_ERROR(session_.Begin(req_.header(), Receipt()));
        return Next::kRead;
      case v1::StepRequest::kLayer:
        RETURN_IF_ERROR(Layer(req_.layer()));
        return Next::kWrite;
      case v1::StepRequest::kCommit:
        RETURN_IF_ERROR(Commit());
        return Next::kWrite;
      case v1::StepRequest::kAbort:
        // The client's own rollback: as a stream closed before commit.
        return absl::AbortedError("step: aborted by the client (abort); rolled back");
      default:
        return absl::InvalidArgumentError(
            "request: expected one of header, layer, commit, abort to be set");
    }
  }

  StepReceipt Receipt() const { return StepReceipt{read_posted_, received_, parsed_}; }

  absl::Status Layer(const v1::LayerRequest& r) {
    // [inline] the lent tensor bytes; the top-k into a lent buffer.
    ASSIGN_OR_RETURN(StepLayerResult res,
                     session_.Layer(r, Receipt(), buffers_->Take(),
                                    [this](LayerInput* in) { inline_.Apply(in); }));
    WriteLayerReply(res.reply, res.meta, std::move(res.topk));
    if (spdlog::should_log(spdlog::level::debug)) {  // [inline] which path the bytes took
      spdlog::debug("[{}] layer {}: {}", Who(), r.layer(), inline_.Describe());
    }
    return absl::OkStatus();
  }

  // Writes StepResponse{layer: reply + {topk: meta + {data: *topk}}} with
  // the top-k bytes as their own slice (no copy); see LayerReplyHead.
  void WriteLayerReply(const v1::LayerReply& reply, const v1::Tensor& meta,
                       std::unique_ptr<std::string> topk) {
    grpc::Slice lent;  // [inline] the top-k in the backend's lent buffer
    const bool from_lent = inline_.TakeTopk(&lent);
    const size_t n = from_lent ? lent.size() : topk->size();
    if (!from_lent) inline_.CopiedTopk(n);
    const std::string head = LayerReplyHead(reply, meta, n);
    grpc::Slice slices[2] = {grpc::Slice(head),
                             from_lent ? std::move(lent) : buffers_->Lend(std::move(topk), n)};
    resp_bytes_ = grpc::ByteBuffer(slices, n > 0 ? 2 : 1);
    state_->metrics.BytesOut(static_cast<int64_t>(head.size() + n));
  }

  absl::Status Commit() {
    ASSIGN_OR_RETURN(v1::StepCommitted committed, session_.Commit());
    resp_.Clear();
    *resp_.mutable_committed() = std::move(committed);
    // Serialize requires an empty buffer: resp_bytes_ still holds the last
    // layer reply's slices (gRPC's writer asserts on a valid buffer once the
    // message outgrows an inlined slice, 23 bytes: ~20 sequences).
    resp_bytes_.Clear();
    bool own_buffer = false;
    RETURN_IF_ERROR(FromGrpcSerialize(
        grpc::SerializationTraits<v1::StepResponse>::Serialize(resp_, &resp_bytes_, &own_buffer)));
    state_->metrics.BytesOut(static_cast<int64_t>(resp_bytes_.Length()));
    return absl::OkStatus();
  }

  static absl::Status FromGrpcSerialize(const grpc::Status& s) {
    if (s.ok()) return absl::OkStatus();
    return absl::InternalError(absl::StrCat("reply: ", s.error_message()));
  }

  ServiceState* state_;
  grpc::CallbackServerContext* ctx_;
  std::shared_ptr<ReplyBuffers> buffers_;
  const std::string client_;  // namespace and quota key (ClientIdentity)
  const Clock::time_point created_;  // the stream's start
  const CallTag tag_;         // x-request-id, traceparent
  InlineTensors inline_;      // [inline] the layer's tensor bytes, lent
  ClientQuotas::Hold bytes_hold_;  // the message being handled
  absl::Mutex mu_;
  bool finished_ ABSL_GUARDED_BY(mu_) = false;  // End claimed
  bool reading_ ABSL_GUARDED_BY(mu_) = false;   // a read is pending
  bool writing_ ABSL_GUARDED_BY(mu_) = false;   // a reply is being written
  Clock::time_point write_since_ ABSL_GUARDED_BY(mu_);
  Clock::time_point read_since_ ABSL_GUARDED_BY(mu_);
  grpc::ByteBuffer req_bytes_;
  grpc::ByteBuffer resp_bytes_;
  v1::StepRequest req_;
  v1::StepResponse resp_;
  Clock::time_point received_;
  Clock::time_point read_posted_;  // the current message's StartRead
  Clock::time_point parsed_;  // the current message's parse done
  StepSession session_;       // the step itself (last: it uses client_, created_)
};

}  // namespace

ServiceState::ServiceState(Engine* e, std::shared_ptr<ReplyBuffers> b)
    : engine(e),
      metrics(e->metrics()),
      client_header(ClientIdHeader(e->model().config)),
      regions(&e->backend(), e->model().config.region_lease_ms()),
      memfd_tokens(e->model().config.memfd_token_ttl_ms()),
      buffers(std::move(b)),
      quotas(LimitsOf(e->model().config), GroupPages(*e), GroupNames(*e)),
      idle_watch(std::chrono::milliseconds(e->model().config.step_idle_ms())),
      rings(std::make_unique<RingHost>(StepDeps(), e->model().config.ring_spin_us(),
                                       std::chrono::milliseconds(e->model().config.step_idle_ms()))),
      executor(ExecutorWorkersFor(e->backend().Kind()), kLayerWorkerNice,
               absl::Microseconds(e->model().config.layer_spin_us())) {}

IndexerService::IndexerService(Engine* engine)
    : engine_(engine),
      instance_id_(NewInstanceId()),
      start_time_unix_ms_(UnixMillisNow()),
      state_(std::make_unique<ServiceState>(engine, std::make_shared<ReplyBuffers>())) {}

IndexerService::~IndexerService() = default;

const ClientQuotas& IndexerService::quotas() const { return state_->quotas; }

grpc::ServerUnaryReactor* IndexerService::GetServerInfo(grpc::CallbackServerContext* ctx,
                                                        const grpc::ByteBuffer* req_bytes,
                                                        grpc::ByteBuffer* resp_bytes) {
  v1::GetServerInfoRequest req;
  absl::Status decoded = Decode(*req_bytes, "GetServerInfoRequest", &req);
  if (!decoded.ok()) return Respond(ctx, decoded);
  v1::ServerInfo info;
  v1::ServerInfo* resp = &info;
  const Model& m = engine_->model();
  resp->set_version(INDEXER_VERSION);
  resp->set_build(INDEXER_BUILD);
  resp->set_device(engine_->backend().Describe());
  resp->set_profile(m.config.profile());
  resp->set_next_n(m.config.next_n());
  for (const char* f : {"dense", "candidate_source", "candidate_consumer", "block", "fp8",
                        "fp8_e4m3fnuz", "mxfp4", "linear", "tiled", "fp32_q", "bf16_q", "prequantized_k",
                        "import", "release", "health", "host_regions", "list_sequences",
                        "export", "host_ring"}) {
    resp->add_features(f);
  }
  if (engine_->backend().Kind() == "gpu") resp->add_features("device_regions");
  if (!memfd_socket_.empty()) {
    resp->add_features("host_regions_memfd");
    resp->set_memfd_socket(memfd_socket_);
  }
  const std::vector<GroupUsage> usage = engine_->Usage();
  for (size_t g = 0; g < m.groups.size(); ++g) {
    const GroupSpec& gs = m.groups[g];
    v1::LayerGroupInfo* gi = resp->add_groups();
    gi->set_name(gs.name);
    gi->set_kv_format(KvFormatName(gs.layout.format));
    gi->set_head_dim(gs.layout.head_dim);
    gi->set_page_entries(gs.layout.page_entries);
    gi->set_compress_ratio(gs.compress_ratio);
    gi->set_ue8m0(gs.ue8m0);
    if (gs.layout.format == KvFormat::kFp8) gi->set_fp8_variant(Fp8VariantName(gs.layout.fp8));
    gi->set_layout(gs.layout_name);
    gi->set_entry_bytes(gs.layout.entry_bytes());
    gi->set_total_pages(usage[g].total_pages);
    gi->set_free_pages(usage[g].free_pages);
    for (int32_t l : gs.layers) gi->add_layers(l);
  }
  for (int32_t l = 0; l < m.num_layers(); ++l) {
    const GroupSpec& gs = m.groups[m.layer_group[l]];
    v1::LayerInfo* li = resp->add_layers();
    li->set_layer(l);
    li->set_group(gs.name);
    const LayerRole role = m.layer_role[l];
    li->set_role(LayerRoleName(role.kind));
    li->set_num_heads(gs.num_heads);
    if (role.kind == LayerRoleKind::kBlock) {
      li->set_topk_blocks(gs.block.topk_blocks);
      li->set_init_blocks(gs.block.init_blocks);
      li->set_local_blocks(gs.block.local_blocks);
      li->set_score("max");
      li->set_scale(gs.block.scale);
    } else {
      li->set_topk(gs.topk);
    }
    if (role.set >= 0) {
      const CandidateSetSpec& cs = m.candidate_sets[role.set];
      li->set_candidate_source(cs.source_layer);
      li->set_candidate_block_size(cs.spec.block_size);
      li->set_candidate_topk_blocks(cs.spec.topk_blocks);
      li->set_pin_newest_block(cs.spec.pin_newest);
    }
  }
  resp->set_max_message_bytes(m.config.max_message_mb() << 20);
  resp->set_logits_budget_bytes(m.logits_budget_bytes());
  resp->set_open_steps(engine_->open_steps());
  resp->set_sequences(engine_->num_sequences());
  resp->set_max_batch(m.config.max_batch());
  resp->set_max_q_len(m.config.max_q_len());
  resp->set_max_seq_len(m.config.max_seq_len());
  resp->set_instance_id(instance_id_);
  resp->set_start_time_unix_ms(start_time_unix_ms_);
  resp->set_sequence_idle_ttl_ms(m.config.sequence_idle_ttl_ms());
  resp->set_idle_released(static_cast<uint64_t>(engine_->idle_released()));
  return Respond(ctx, Encode(absl::OkStatus(), info, resp_bytes));
}

grpc::ServerUnaryReactor* IndexerService::Release(grpc::CallbackServerContext* ctx,
                                                  const grpc::ByteBuffer* req_bytes,
                                                  grpc::ByteBuffer* resp_bytes) {
  v1::ReleaseRequest req;
  absl::Status s = Decode(*req_bytes, "ReleaseRequest", &req);
  if (!s.ok()) return Respond(ctx, s);
  auto names = ToReleaseNames(req, state_->Client(*ctx));
  if (!names.ok()) return Respond(ctx, names.status());
  v1::ReleaseResponse resp;
  auto freed = engine_->Release(*names);
  if (freed.ok()) resp.set_released_pages(*freed);
  return Respond(ctx, Encode(freed.status(), resp, resp_bytes));
}

// The import runs on the executor (it writes every layer's entries); the
// request's bytes count against the client until it is done.
grpc::ServerUnaryReactor* IndexerService::WriteEntries(grpc::CallbackServerContext* ctx,
                                                       const grpc::ByteBuffer* req_bytes,
                                                       grpc::ByteBuffer* resp_bytes) {
  grpc::ServerUnaryReactor* reactor = ctx->DefaultReactor();
  auto hold = std::make_shared<ClientQuotas::Hold>();
  const std::string client = state_->Client(*ctx);
  state_->metrics.BytesIn(static_cast<int64_t>(req_bytes->Length()));
  absl::Status taken = state_->quotas.TakeBytes(client,
                                                static_cast<int64_t>(req_bytes->Length()),
                                                hold.get());
  if (!taken.ok()) {
    state_->metrics.Rejected(Rejection::kQuota);
    state_->LogRejection("import", taken);
    reactor->Finish(ToGrpcStatus(taken));
    return reactor;
  }
  Engine* engine = engine_;
  state_->executor.Post([engine, reactor, req_bytes, resp_bytes, hold, client, ctx] {
    v1::WriteEntriesRequest req;
    v1::WriteEntriesResponse resp;
    absl::Status s = [&]() -> absl::Status {
      // A call the client no longer waits for (cancelled, or refused by the
      // transport's memory quota) is not imported. A cancel that arrives
      // during the import cannot undo it: the client then learns the
      // outcome from the sequence's length.
      if (ctx->IsCancelled()) {
        return absl::CancelledError("import: the call was cancelled before it ran; nothing written");
      }
      RETURN_IF_ERROR(Decode(*req_bytes, "WriteEntriesRequest", &req));
      ASSIGN_OR_RETURN(ImportArgs args, ToImport(req, engine->model().config.max_q_len(), client));
      ASSIGN_OR_RETURN(int64_t len,
                       engine->Import(args.name, args.create, args.num_tokens, args.layers));
      resp.set_seq_len(static_cast<uint64_t>(len));
      return absl::OkStatus();
    }();
    hold->Reset();
    engine->metrics().ImportEnded(s.ok());
    reactor->Finish(ToGrpcStatus(Encode(s, resp, resp_bytes)));
  });
  return reactor;
}

grpc::ServerBidiReactor<grpc::ByteBuffer, grpc::ByteBuffer>* IndexerService::Step(
    grpc::CallbackServerContext* ctx) {
  return new StepReactor(state_.get(), ctx);
}

RegionRegistry& IndexerService::regions() { return state_->regions; }
MemfdTokens& IndexerService::memfd_tokens() { return state_->memfd_tokens; }

grpc::ServerUnaryReactor* IndexerService::ListSequences(grpc::CallbackServerContext* ctx,
                                                        const grpc::ByteBuffer* req,
                                                        grpc::ByteBuffer* resp) {
  return ServeListSequences(engine_, state_->Client(*ctx), ctx, req, resp);
}

grpc::ServerWriteReactor<grpc::ByteBuffer>* IndexerService::ExportEntries(
    grpc::CallbackServerContext* ctx, const grpc::ByteBuffer* req) {
  return ServeExportEntries(engine_, &state_->executor, state_->Client(*ctx), ctx, req);
}

absl::StatusOr<uint64_t> IndexerService::RegisterMemfd(const grpc::CallbackServerContext& ctx,
                                                       const std::string& owner,
                                                       const std::string& name,
                                                       const v1::HostRegion& h) {
  if (!h.shm_name().empty()) {
    return absl::InvalidArgumentError(
        "host: expected one of shm_name and memfd_token, got both");
  }
  if (memfd_socket_.empty()) {
    return absl::FailedPreconditionError(
        "host.memfd_token: this daemon has no memfd socket (feature host_regions_memfd; "
        "config memfd_socket)");
  }
  // The sender's uid must be the caller's where this host can tell the
  // caller's (TCP from this host); a Unix-socket caller passed the socket
  // file's mode; a caller from elsewhere cannot hold a memfd of this host.
  const PeerUid peer = LookupPeerUid(ctx.peer());
  if (peer.kind == PeerUid::kOther || (peer.kind == PeerUid::kTcp && !peer.uid.has_value())) {
    return absl::PermissionDeniedError(absl::StrCat(
        "host.memfd_token: memfds register only from a client on the daemon's host (the "
        "caller, ", CapText(ctx.peer()), ", is not a socket of this host)"));
  }
  return state_->memfd_tokens.Redeem(
      "host.memfd_token", h.memfd_token(), peer.uid, [&](const MemfdClaim& c) {
        return state_->regions.RegisterHostFd(owner, name, c.fd, h.offset(), h.bytes(),
                                              absl::StrCat(c.memfd_name, " (pid ", c.pid, ")"));
      });
}

grpc::ServerUnaryReactor* IndexerService::RegisterRegion(grpc::CallbackServerContext* ctx,
                                                         const grpc::ByteBuffer* req_bytes,
                                                         grpc::ByteBuffer* resp_bytes) {
  v1::RegisterRegionRequest req;
  absl::Status decoded = Decode(*req_bytes, "RegisterRegionRequest", &req);
  if (!decoded.ok()) return Respond(ctx, decoded);
  const std::string owner = state_->Owner(*ctx);
  RegionRegistry& regions = state_->regions;
  absl::StatusOr<uint64_t> id;
  switch (req.kind_case()) {
    case v1::RegisterRegionRequest::kHost: {
      const v1::HostRegion& h = req.host();
      if (h.memfd_token().empty()) {
        id = regions.RegisterHost(owner, req.name(), h.shm_name(), h.offset(), h.bytes());
      } else {
        id = RegisterMemfd(*ctx, owner, req.name(), h);
      }
      break;
    }
    case v1::RegisterRegionRequest::kDevice: {
      const v1::DeviceRegion& d = req.device();
      id = regions.RegisterDevice(
          owner, req.name(),
          DeviceRegionSpec{d.ipc_handle(), d.device_uuid(), d.pci_bus_id(), d.offset(), d.bytes()});
      break;
    }
    default:
      id = absl::InvalidArgumentError("kind: expected host or device to be set");
  }
  if (!id.ok()) {
    state_->LogRejection("register region", id.status());
    return Respond(ctx, id.status());
  }
  v1::RegisterRegionResponse resp;
  resp.set_region(*id);
  resp.set_lease_ms(regions.lease_ms());
  spdlog::debug("region {} registered ({} bytes)", *id,
                req.has_host() ? req.host().bytes() : req.device().bytes());
  return Respond(ctx, Encode(absl::OkStatus(), resp, resp_bytes));
}

grpc::ServerUnaryReactor* IndexerService::UnregisterRegion(grpc::CallbackServerContext* ctx,
                                                           const grpc::ByteBuffer* req_bytes,
                                                           grpc::ByteBuffer* resp_bytes) {
  v1::UnregisterRegionRequest req;
  absl::Status s = Decode(*req_bytes, "UnregisterRegionRequest", &req);
  if (s.ok()) {
    const std::string owner = state_->Owner(*ctx);
    // Its ring first (its open step rolls back): the ring pins the region.
    state_->rings->DetachRegion(owner, req.region());
    s = state_->regions.Unregister(owner, req.region());
  }
  return Respond(ctx, Encode(s, v1::UnregisterRegionResponse(), resp_bytes));
}

grpc::ServerUnaryReactor* IndexerService::ListRegions(grpc::CallbackServerContext* ctx,
                                                      const grpc::ByteBuffer* req_bytes,
                                                      grpc::ByteBuffer* resp_bytes) {
  v1::ListRegionsRequest req;
  absl::Status s = Decode(*req_bytes, "ListRegionsRequest", &req);
  if (!s.ok()) return Respond(ctx, s);
  v1::ListRegionsResponse resp;
  for (const RegionListing& l : state_->regions.List(state_->Owner(*ctx))) {
    v1::RegionInfo* ri = resp.add_regions();
    ri->set_region(l.region);
    ri->set_name(l.name);
    ri->set_kind(l.kind);
    ri->set_bytes(l.bytes);
    ri->set_where(l.where);
    ri->set_idle_ms(l.idle_ms);
  }
  return Respond(ctx, Encode(absl::OkStatus(), resp, resp_bytes));
}

grpc::ServerUnaryReactor* IndexerService::AttachRing(grpc::CallbackServerContext* ctx,
                                                     const grpc::ByteBuffer* req_bytes,
                                                     grpc::ByteBuffer* resp_bytes) {
  v1::AttachRingRequest req;
  absl::Status decoded = Decode(*req_bytes, "AttachRingRequest", &req);
  if (!decoded.ok()) return Respond(ctx, decoded);
  auto ring = state_->rings->Attach(state_->Client(*ctx), state_->Owner(*ctx), ctx->peer(),
                                    req.region(), req.offset());
  if (!ring.ok()) {
    state_->LogRejection("attach ring", ring.status());
    return Respond(ctx, ring.status());
  }
  v1::AttachRingResponse resp;
  resp.set_ring(*ring);
  resp.set_spin_us(state_->rings->spin_us());
  return Respond(ctx, Encode(absl::OkStatus(), resp, resp_bytes));
}

grpc::ServerUnaryReactor* IndexerService::DetachRing(grpc::CallbackServerContext* ctx,
                                                     const grpc::ByteBuffer* req_bytes,
                                                     grpc::ByteBuffer* resp_bytes) {
  v1::DetachRingRequest req;
  absl::Status s = Decode(*req_bytes, "DetachRingRequest", &req);
  if (!s.ok()) return Respond(ctx, s);
  v1::DetachRingResponse resp;
  auto rolled_back = state_->rings->Detach(state_->Owner(*ctx), req.ring());
  if (rolled_back.ok()) resp.set_rolled_back(*rolled_back);
  return Respond(ctx, Encode(rolled_back.status(), resp, resp_bytes));
}

size_t IndexerService::rings() const { return state_->rings->size(); }

}  // namespace indexer

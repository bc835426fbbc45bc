#include "server/rpc/service.h"

#include <chrono>
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
#include "server/rpc/grpc_status.h"
#include "server/rpc/identity.h"
#include "server/rpc/reply_wire.h"
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

// The caller's sequence namespace (SPEC §6 "Clients and tenancy"): its TLS
// identity, else the configured header. Another namespace's sequence is
// simply not found.
std::string CallerNamespace(const grpc::CallbackServerContext& ctx, const Engine& engine) {
  return ClientIdentity(ctx, ClientIdHeader(engine.model().config));
}

grpc::ServerUnaryReactor* Respond(grpc::CallbackServerContext* ctx,
                                  const absl::Status& s) {
  auto* reactor = ctx->DefaultReactor();
  reactor->Finish(ToGrpcStatus(s));
  return reactor;
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
// time (read, work, write, read ...); the open Step rolls back in OnDone
// unless it committed, which covers errors, cancellation and lost clients.
class StepReactor final
    : public grpc::ServerBidiReactor<grpc::ByteBuffer, grpc::ByteBuffer> {
 public:
  StepReactor(Engine* engine, std::shared_ptr<ReplyBuffers> buffers,
              grpc::CallbackServerContext* ctx, RegionRegistry* regions, std::string owner)
      : engine_(engine),
        ctx_(ctx),
        buffers_(std::move(buffers)),
        regions_(regions),
        owner_(std::move(owner)) {
    StartRead(&req_bytes_);
  }

  void OnReadDone(bool ok) override {
    if (!ok) {
      // Half-close or cancellation before commit.
      if (step_) spdlog::info("[{}] closed before commit: rolled back", step_->id());
      End(grpc::Status(grpc::StatusCode::ABORTED,
                       "step: stream closed before commit; rolled back"));
      return;
    }
    // Receipt: the message is whole. Its parse (below) is part of the
    // layer's queue and total times, so that what the client sees outside
    // the server is the transport alone.
    received_ = Clock::now();
    // What the generated (typed) handler does, here in the reactor: parse
    // into req_ (one copy of the tensors out of the transport's slices).
    if (!grpc::SerializationTraits<v1::StepRequest>::Deserialize(&req_bytes_, &req_).ok()) {
      End(grpc::Status(grpc::StatusCode::INVALID_ARGUMENT,
                       "request: expected a StepRequest message"));
      return;
    }
    absl::Status s = Handle();
    if (!s.ok()) {
      spdlog::warn("[{}] {}: {}", step_ ? step_->id() : std::string("step"),
                   absl::StatusCodeToString(s.code()), std::string(s.message()));
      End(ToGrpcStatus(s));
    }
  }

  void OnWriteDone(bool ok) override {
    // The layer's reply is out: its regions may be unmapped from now on.
    pins_.clear();
    if (!ok) {
      End(grpc::Status(grpc::StatusCode::CANCELLED, "step: reply not delivered"));
      return;
    }
    if (committed_) {
      End(grpc::Status::OK);
      return;
    }
    StartRead(&req_bytes_);
  }

  void OnDone() override {
    step_.reset();  // a cancelled stream ends here without End()
    pins_.clear();
    delete this;
  }

 private:
  // Rolls back (unless committed) before the client can see the final
  // status, so a client that retries at once finds its sequences free.
  void End(const grpc::Status& status) {
    step_.reset();
    pins_.clear();  // the failed layer wrote nothing more after this
    Finish(status);
  }

  absl::Status Handle() {
    switch (req_.kind_case()) {
      case v1::StepRequest::kHeader:
        RETURN_IF_ERROR(Begin(req_.header()));
        StartRead(&req_bytes_);
        return absl::OkStatus();
      case v1::StepRequest::kLayer:
        return Layer(req_.layer());
      case v1::StepRequest::kCommit:
        return Commit();
      default:
        return absl::InvalidArgumentError(
            "request: expected one of header, layer, commit to be set");
    }
  }

  absl::Status Begin(const v1::StepHeader& h) {
    if (step_) {
      return absl::FailedPreconditionError("header: already received; expected layer or commit");
    }
    ASSIGN_OR_RETURN(StepSpec spec, ToStepSpec(h, CallerNamespace(*ctx_, *engine_)));
    ASSIGN_OR_RETURN(step_, engine_->BeginStep(spec));
    spdlog::debug("[{}] begin: {} sequences, {} rows, peer {}", step_->id(),
                  spec.seqs.size(), step_->num_rows(), ctx_->peer());
    return absl::OkStatus();
  }

  absl::Status Layer(const v1::LayerRequest& r) {
    if (!step_) return absl::FailedPreconditionError("layer: expected the header first");
    // References pin their regions in pins_ until the reply is written.
    pins_.clear();
    auto converted = ToLayerInput(r, RegionResolver{regions_, owner_, &pins_});
    if (!converted.ok()) {
      return absl::Status(converted.status().code(),
                          absl::StrCat("layer ", r.layer(), ": ", converted.status().message()));
    }
    LayerInput& in = *converted;
    // The backend writes the indices straight into a reply buffer, which
    // goes on the wire as it is (see WriteLayerReply), or into the caller's
    // topk_out region (the reply then carries dtype and shape only).
    std::unique_ptr<std::string> topk = buffers_->Take();
    if (in.topk_out.present) {
      topk->clear();  // no bytes in the reply
    } else {
      in.out_bytes = topk.get();
    }
    const Clock::time_point start = Clock::now();
    auto out = step_->RunLayer(in);
    if (!out.ok()) {
      return absl::Status(out.status().code(),
                          absl::StrCat("layer ", r.layer(), ": ", out.status().message()));
    }
    v1::LayerReply reply;
    reply.set_layer(r.layer());
    v1::LayerTimings* tm = reply.mutable_timings();
    tm->set_queue_us(MicrosBetween(received_, start));
    tm->set_validate_us(out->validate_us);
    tm->set_write_us(out->timings.write_us);
    tm->set_logits_us(out->timings.logits_us);
    tm->set_topk_us(out->timings.topk_us);
    tm->set_total_us(MicrosBetween(received_, Clock::now()));
    v1::Tensor meta;
    meta.set_dtype(v1::INT32);
    for (int64_t d : out->shape) meta.add_shape(d);
    WriteLayerReply(reply, meta, std::move(topk));
    return absl::OkStatus();
  }

  // Writes StepResponse{layer: reply + {topk: meta + {data: *topk}}} with
  // the top-k bytes as their own slice (no copy); see LayerReplyHead.
  void WriteLayerReply(const v1::LayerReply& reply, const v1::Tensor& meta,
                       std::unique_ptr<std::string> topk) {
    const size_t n = topk->size();
    const std::string head = LayerReplyHead(reply, meta, n);
    grpc::Slice slices[2] = {grpc::Slice(head), buffers_->Lend(std::move(topk), n)};
    resp_bytes_ = grpc::ByteBuffer(slices, n > 0 ? 2 : 1);
    StartWrite(&resp_bytes_);
  }

  absl::Status Commit() {
    if (!step_) return absl::FailedPreconditionError("commit: expected the header first");
    ASSIGN_OR_RETURN(std::vector<int64_t> lens, step_->Commit());
    resp_.Clear();
    for (int64_t l : lens) resp_.mutable_committed()->add_seq_lens(static_cast<uint64_t>(l));
    spdlog::debug("[{}] committed", step_->id());
    committed_ = true;
    // Serialize requires an empty buffer: resp_bytes_ still holds the last
    // layer reply's slices (gRPC's writer asserts on a valid buffer once the
    // message outgrows an inlined slice, 23 bytes: ~20 sequences).
    resp_bytes_.Clear();
    bool own_buffer = false;
    RETURN_IF_ERROR(FromGrpcSerialize(
        grpc::SerializationTraits<v1::StepResponse>::Serialize(resp_, &resp_bytes_, &own_buffer)));
    StartWrite(&resp_bytes_);
    return absl::OkStatus();
  }

  static absl::Status FromGrpcSerialize(const grpc::Status& s) {
    if (s.ok()) return absl::OkStatus();
    return absl::InternalError(absl::StrCat("reply: ", s.error_message()));
  }

  Engine* engine_;
  grpc::CallbackServerContext* ctx_;
  std::shared_ptr<ReplyBuffers> buffers_;
  RegionRegistry* regions_;
  const std::string owner_;
  std::vector<PinnedRegion> pins_;  // regions of the layer in flight
  grpc::ByteBuffer req_bytes_;
  grpc::ByteBuffer resp_bytes_;
  v1::StepRequest req_;
  v1::StepResponse resp_;
  std::unique_ptr<indexer::Step> step_;
  Clock::time_point received_;
  bool committed_ = false;
};

}  // namespace

IndexerService::IndexerService(Engine* engine)
    : engine_(engine),
      regions_(&engine->backend(), engine->model().config.region_lease_ms()),
      client_id_header_(ClientIdHeader(engine->model().config)),
      reply_buffers_(std::make_shared<ReplyBuffers>()) {}

std::string IndexerService::Owner(const grpc::CallbackServerContext& ctx) const {
  std::string id = ClientIdentity(ctx, client_id_header_);
  if (id.empty()) id = "peer:" + ctx.peer();
  return id;
}

IndexerService::~IndexerService() = default;

grpc::ServerUnaryReactor* IndexerService::GetServerInfo(
    grpc::CallbackServerContext* ctx, const v1::GetServerInfoRequest*,
    v1::ServerInfo* resp) {
  const Model& m = engine_->model();
  resp->set_version(INDEXER_VERSION);
  resp->set_build(INDEXER_BUILD);
  resp->set_device(engine_->backend().Describe());
  resp->set_profile(m.config.profile());
  resp->set_next_n(m.config.next_n());
  for (const char* f : {"dense", "candidate_source", "candidate_consumer", "block", "fp8",
                        "mxfp4", "linear", "tiled", "fp32_q", "bf16_q", "prequantized_k",
                        "import", "release", "health", "host_regions"}) {
    resp->add_features(f);
  }
  if (engine_->backend().Kind() == "gpu") resp->add_features("device_regions");
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
  return Respond(ctx, absl::OkStatus());
}

grpc::ServerUnaryReactor* IndexerService::Release(grpc::CallbackServerContext* ctx,
                                                  const v1::ReleaseRequest* req,
                                                  v1::ReleaseResponse* resp) {
  auto names = ToReleaseNames(*req, CallerNamespace(*ctx, *engine_));
  if (!names.ok()) return Respond(ctx, names.status());
  auto freed = engine_->Release(*names);
  if (freed.ok()) resp->set_released_pages(*freed);
  return Respond(ctx, freed.status());
}

grpc::ServerUnaryReactor* IndexerService::WriteEntries(
    grpc::CallbackServerContext* ctx, const v1::WriteEntriesRequest* req,
    v1::WriteEntriesResponse* resp) {
  auto args = ToImport(*req, engine_->model().config.max_q_len(),
                       CallerNamespace(*ctx, *engine_));
  if (!args.ok()) return Respond(ctx, args.status());
  auto len = engine_->Import(args->name, args->create, args->num_tokens, args->layers);
  if (len.ok()) resp->set_seq_len(*len);
  return Respond(ctx, len.status());
}

grpc::ServerBidiReactor<grpc::ByteBuffer, grpc::ByteBuffer>* IndexerService::Step(
    grpc::CallbackServerContext* ctx) {
  return new StepReactor(engine_, reply_buffers_, ctx, &regions_, Owner(*ctx));
}

grpc::ServerUnaryReactor* IndexerService::RegisterRegion(grpc::CallbackServerContext* ctx,
                                                         const v1::RegisterRegionRequest* req,
                                                         v1::RegisterRegionResponse* resp) {
  const std::string owner = Owner(*ctx);
  absl::StatusOr<uint64_t> id;
  switch (req->kind_case()) {
    case v1::RegisterRegionRequest::kHost: {
      const v1::HostRegion& h = req->host();
      id = regions_.RegisterHost(owner, req->name(), h.shm_name(), h.offset(), h.bytes());
      break;
    }
    case v1::RegisterRegionRequest::kDevice: {
      const v1::DeviceRegion& d = req->device();
      id = regions_.RegisterDevice(
          owner, req->name(),
          DeviceRegionSpec{d.ipc_handle(), d.device_uuid(), d.pci_bus_id(), d.offset(), d.bytes()});
      break;
    }
    default:
      id = absl::InvalidArgumentError("kind: expected host or device to be set");
  }
  if (!id.ok()) {
    // The message carries client-chosen names: escaped, so they cannot
    // forge log lines.
    spdlog::warn("register region: {}: {}", absl::StatusCodeToString(id.status().code()),
                 absl::CHexEscape(id.status().message()));
    return Respond(ctx, id.status());
  }
  resp->set_region(*id);
  resp->set_lease_ms(regions_.lease_ms());
  spdlog::debug("region {} registered ({} bytes)", *id,
                req->has_host() ? req->host().bytes() : req->device().bytes());
  return Respond(ctx, absl::OkStatus());
}

grpc::ServerUnaryReactor* IndexerService::UnregisterRegion(
    grpc::CallbackServerContext* ctx, const v1::UnregisterRegionRequest* req,
    v1::UnregisterRegionResponse*) {
  return Respond(ctx, regions_.Unregister(Owner(*ctx), req->region()));
}

grpc::ServerUnaryReactor* IndexerService::ListRegions(grpc::CallbackServerContext* ctx,
                                                      const v1::ListRegionsRequest*,
                                                      v1::ListRegionsResponse* resp) {
  for (const RegionListing& l : regions_.List(Owner(*ctx))) {
    v1::RegionInfo* ri = resp->add_regions();
    ri->set_region(l.region);
    ri->set_name(l.name);
    ri->set_kind(l.kind);
    ri->set_bytes(l.bytes);
    ri->set_where(l.where);
    ri->set_idle_ms(l.idle_ms);
  }
  return Respond(ctx, absl::OkStatus());
}

}  // namespace indexer

#include "server/rpc/lifecycle_service.h"

#include <algorithm>
#include <memory>
#include <utility>

#include "absl/strings/str_cat.h"
#include "indexer/v1/indexer.pb.h"
#include "kernels/common/status_macros.h"
#include "server/rpc/convert.h"
#include "server/rpc/executor.h"
#include "server/rpc/grpc_status.h"
#include "server/rpc/log_safe.h"  // CapText
#include "server/rpc/raw_codec.h"
#include "spdlog/spdlog.h"

namespace indexer {

grpc::ServerUnaryReactor* ServeListSequences(Engine* engine, const std::string& client,
                                             grpc::CallbackServerContext* ctx,
                                             const grpc::ByteBuffer* req_bytes,
                                             grpc::ByteBuffer* resp_bytes) {
  v1::ListSequencesRequest req;
  absl::Status s = Decode(*req_bytes, "ListSequencesRequest", &req);
  if (!s.ok()) return Respond(ctx, s);
  if (req.page_size() > kListSequencesMaxPage) {
    return Respond(ctx, absl::InvalidArgumentError(absl::StrCat(
                            "page_size: expected 0..", kListSequencesMaxPage, " (0 = ",
                            kListSequencesDefaultPage, "), got ", req.page_size())));
  }
  const size_t limit = req.page_size() == 0 ? kListSequencesDefaultPage : req.page_size();
  auto page = engine->ListSequences(client, req.page_token(), limit);
  v1::ListSequencesResponse resp;
  if (page.ok()) {
    for (const SequenceListing& l : page->sequences) {
      v1::SequenceInfo* si = resp.add_sequences();
      if (l.numeric) {
        si->mutable_id()->set_num(l.num);
      } else {
        si->mutable_id()->set_name(l.name);
      }
      si->set_length(static_cast<uint64_t>(l.length));
      for (int64_t p : l.pages) si->add_pages(static_cast<uint64_t>(p));
      si->set_idle_ms(static_cast<uint64_t>(l.idle_ms));
      si->set_busy(l.busy);
    }
    resp.set_next_page_token(page->next_cursor);
  }
  return Respond(ctx, Encode(page.status(), resp, resp_bytes));
}

namespace {

// One ExportEntries stream: each message is built on the executor (the
// backend reads the pools there, never on gRPC's threads), then written;
// the next is built when the write completes, so one message at a time is
// in memory. The export's pin on the sequence ends before the stream's
// status is sent.
//
// Threads: the constructor, OnWriteDone and the executor task never run at
// the same time (each starts the next), and OnDone comes after Finish.
class ExportReactor final : public grpc::ServerWriteReactor<grpc::ByteBuffer> {
 public:
  ExportReactor(Engine* engine, Executor* executor, const std::string& client,
                grpc::CallbackServerContext* ctx, const grpc::ByteBuffer* req_bytes)
      : engine_(engine), executor_(executor), ctx_(ctx) {
    absl::Status s = Start(client, *req_bytes);
    if (!s.ok()) {
      Fail(s);
      return;
    }
    executor_->Post([this] { WriteNext(); });
  }

  void OnWriteDone(bool ok) override {
    if (!ok) {
      End(grpc::Status(grpc::StatusCode::CANCELLED, "export: reply not delivered"));
      return;
    }
    if (export_->done()) {
      spdlog::debug("export {}: {} tokens sent", display_, export_->length());
      End(grpc::Status::OK);
      return;
    }
    executor_->Post([this] { WriteNext(); });
  }

  void OnDone() override { delete this; }

 private:
  absl::Status Start(const std::string& client, const grpc::ByteBuffer& bytes) {
    RETURN_IF_ERROR(Decode(bytes, "ExportEntriesRequest", &req_));
    const config::ServerConfig& cfg = engine_->model().config;
    ASSIGN_OR_RETURN(ExportArgs args,
                     ToExport(req_, static_cast<int64_t>(cfg.max_message_mb()) << 20,
                              cfg.max_q_len(), client));
    display_ = args.name.display;
    max_bytes_ = args.max_message_bytes;
    max_tokens_ = args.max_tokens;
    ASSIGN_OR_RETURN(export_, engine_->Export(args.name));
    return absl::OkStatus();
  }

  // Executor: the next chunk as a WriteEntriesRequest, then its write.
  void WriteNext() {
    if (ctx_->IsCancelled()) {
      End(grpc::Status(grpc::StatusCode::CANCELLED, "export: cancelled by the client"));
      return;
    }
    const int32_t num_layers = engine_->model().num_layers();
    auto chunk = export_->Next(max_bytes_ - ExportFramingBytes(num_layers), max_tokens_,
                               "max_message_bytes");
    if (!chunk.ok()) {
      Fail(chunk.status());
      return;
    }
    v1::WriteEntriesRequest msg = ExportMessage(engine_->model(), req_.id(), *chunk);
    if (static_cast<int64_t>(msg.ByteSizeLong()) > max_bytes_) {
      Fail(absl::InternalError(absl::StrCat("export: a message of ", msg.ByteSizeLong(),
                                            " bytes exceeds max_message_bytes = ", max_bytes_)));
      return;
    }
    out_.Clear();
    absl::Status s = Encode(absl::OkStatus(), msg, &out_);
    if (!s.ok()) {
      Fail(s);
      return;
    }
    StartWrite(&out_);
  }

  void Fail(const absl::Status& s) {
    // display_ is escaped already (SeqName).
    spdlog::warn("[export{}] {}: {}", display_.empty() ? "" : " " + display_,
                 absl::StatusCodeToString(s.code()), CapText(s.message()));
    End(ToGrpcStatus(s));
  }

  // Unpins the sequence before the client can see the status, so that a
  // Release right after it succeeds.
  void End(const grpc::Status& status) {
    export_.reset();
    Finish(status);
  }

  Engine* engine_;
  Executor* executor_;
  grpc::CallbackServerContext* ctx_;
  v1::ExportEntriesRequest req_;
  std::string display_;  // the sequence, for logs
  int64_t max_bytes_ = 0;
  int64_t max_tokens_ = 0;
  std::unique_ptr<SequenceExport> export_;
  grpc::ByteBuffer out_;
};

}  // namespace

grpc::ServerWriteReactor<grpc::ByteBuffer>* ServeExportEntries(Engine* engine, Executor* executor,
                                                               const std::string& client,
                                                               grpc::CallbackServerContext* ctx,
                                                               const grpc::ByteBuffer* req) {
  return new ExportReactor(engine, executor, client, ctx, req);
}

}  // namespace indexer

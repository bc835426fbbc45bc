// indexer.v1.Indexer on gRPC's callback API. Converts messages to the core's
// types, calls the Engine and converts back; no indexer logic lives here.
#pragma once

#include <memory>

#include "indexer/v1/indexer.grpc.pb.h"
#include "server/core/engine.h"

namespace indexer {

class ReplyBuffers;

// Step is served on raw bytes (WithRawCallbackMethod_Step): the request is
// parsed by the reactor and a layer's reply goes out with its top-k bytes as
// a slice of their own, without a serialization copy. The wire messages are
// the same StepRequest / StepResponse.
using IndexerServiceBase = v1::Indexer::WithCallbackMethod_GetServerInfo<
    v1::Indexer::WithCallbackMethod_Release<v1::Indexer::WithCallbackMethod_WriteEntries<
        v1::Indexer::WithRawCallbackMethod_Step<v1::Indexer::Service>>>>;

class IndexerService final : public IndexerServiceBase {
 public:
  // REQUIRES: `engine` outlives the service.
  explicit IndexerService(Engine* engine);
  ~IndexerService() override;

  grpc::ServerUnaryReactor* GetServerInfo(grpc::CallbackServerContext* ctx,
                                          const v1::GetServerInfoRequest* req,
                                          v1::ServerInfo* resp) override;
  grpc::ServerUnaryReactor* Release(grpc::CallbackServerContext* ctx,
                                    const v1::ReleaseRequest* req,
                                    v1::ReleaseResponse* resp) override;
  grpc::ServerUnaryReactor* WriteEntries(grpc::CallbackServerContext* ctx,
                                         const v1::WriteEntriesRequest* req,
                                         v1::WriteEntriesResponse* resp) override;
  grpc::ServerBidiReactor<grpc::ByteBuffer, grpc::ByteBuffer>* Step(
      grpc::CallbackServerContext* ctx) override;

 private:
  Engine* engine_;
  std::shared_ptr<ReplyBuffers> reply_buffers_;  // reply slices hold it too
};

}  // namespace indexer

// indexer.v1.Indexer on gRPC's callback API. Converts messages to the core's
// types, calls the Engine and converts back; no indexer logic lives here.
#pragma once

#include "indexer/v1/indexer.grpc.pb.h"
#include "server/core/engine.h"

namespace indexer {

class IndexerService final : public v1::Indexer::CallbackService {
 public:
  // REQUIRES: `engine` outlives the service.
  explicit IndexerService(Engine* engine) : engine_(engine) {}

  grpc::ServerUnaryReactor* GetServerInfo(grpc::CallbackServerContext* ctx,
                                          const v1::GetServerInfoRequest* req,
                                          v1::ServerInfo* resp) override;
  grpc::ServerUnaryReactor* Release(grpc::CallbackServerContext* ctx,
                                    const v1::ReleaseRequest* req,
                                    v1::ReleaseResponse* resp) override;
  grpc::ServerUnaryReactor* WriteEntries(grpc::CallbackServerContext* ctx,
                                         const v1::WriteEntriesRequest* req,
                                         v1::WriteEntriesResponse* resp) override;
  grpc::ServerBidiReactor<v1::StepRequest, v1::StepResponse>* Step(
      grpc::CallbackServerContext* ctx) override;

 private:
  Engine* engine_;
};

}  // namespace indexer

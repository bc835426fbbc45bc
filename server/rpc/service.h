// indexer.v1.Indexer on gRPC's callback API. Converts messages to the core's
// types, calls the Engine and converts back; no indexer logic lives here.
#pragma once

#include <memory>
#include <string>

#include "indexer/v1/indexer.grpc.pb.h"
#include "server/core/engine.h"
#include "server/core/regions.h"

namespace indexer {

class ReplyBuffers;

// Step is served on raw bytes (WithRawCallbackMethod_Step): the request is
// parsed by the reactor and a layer's reply goes out with its top-k bytes as
// a slice of their own, without a serialization copy. The wire messages are
// the same StepRequest / StepResponse.
using IndexerServiceBase = v1::Indexer::WithCallbackMethod_GetServerInfo<
    v1::Indexer::WithCallbackMethod_Release<v1::Indexer::WithCallbackMethod_WriteEntries<
        v1::Indexer::WithRawCallbackMethod_Step<v1::Indexer::WithCallbackMethod_RegisterRegion<
            v1::Indexer::WithCallbackMethod_UnregisterRegion<
                v1::Indexer::WithCallbackMethod_ListRegions<v1::Indexer::Service>>>>>>>;

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
  // Regions (SPEC §6 data plane): owned by the caller's identity (see
  // identity.h; without one, "peer:" + the connection's peer address).
  grpc::ServerUnaryReactor* RegisterRegion(grpc::CallbackServerContext* ctx,
                                           const v1::RegisterRegionRequest* req,
                                           v1::RegisterRegionResponse* resp) override;
  grpc::ServerUnaryReactor* UnregisterRegion(grpc::CallbackServerContext* ctx,
                                             const v1::UnregisterRegionRequest* req,
                                             v1::UnregisterRegionResponse* resp) override;
  grpc::ServerUnaryReactor* ListRegions(grpc::CallbackServerContext* ctx,
                                        const v1::ListRegionsRequest* req,
                                        v1::ListRegionsResponse* resp) override;

  RegionRegistry& regions() { return regions_; }

 private:
  std::string Owner(const grpc::CallbackServerContext& ctx) const;

  Engine* engine_;
  RegionRegistry regions_;
  std::string client_id_header_;
  std::shared_ptr<ReplyBuffers> reply_buffers_;  // reply slices hold it too
};

}  // namespace indexer

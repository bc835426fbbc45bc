// indexer.v1.Indexer on gRPC's callback API. Converts messages to the core's
// types, calls the Engine and converts back; no indexer logic lives here.
//
// Threads: gRPC's callback threads only receive, check quotas and dispatch.
// Layer work (Step layers and commits, WriteEntries' import) runs on the
// service's Executor, so health checks and GetServerInfo answer while the
// device is saturated.
#pragma once

#include <memory>
#include <string>

#include "indexer/v1/indexer.grpc.pb.h"
#include "server/core/engine.h"
#include "server/core/memfd_tokens.h"
#include "server/core/regions.h"

namespace indexer {

class ReplyBuffers;
class Executor;
class ClientQuotas;
class IdleWatch;
class RateLimiter;

// Every method is served on raw bytes: the request is parsed by the service
// so that bytes that do not decode get INVALID_ARGUMENT naming the expected
// request type (gRPC's generated handler answers them with an empty
// status), and a Step layer's reply goes out with its top-k bytes as a slice
// of their own, without a serialization copy. The wire messages are the
// generated ones.
using IndexerServiceBase = v1::Indexer::WithRawCallbackMethod_GetServerInfo<
    v1::Indexer::WithRawCallbackMethod_Release<v1::Indexer::WithRawCallbackMethod_WriteEntries<
        v1::Indexer::WithRawCallbackMethod_Step<v1::Indexer::WithRawCallbackMethod_RegisterRegion<
            v1::Indexer::WithRawCallbackMethod_UnregisterRegion<
                v1::Indexer::WithRawCallbackMethod_ListRegions<
                    v1::Indexer::WithRawCallbackMethod_ListSequences<
                        v1::Indexer::WithRawCallbackMethod_ExportEntries<
                            v1::Indexer::WithRawCallbackMethod_AttachRing<
                                v1::Indexer::WithRawCallbackMethod_DetachRing<
                                    v1::Indexer::Service>>>>>>>>>>>;

// What the service's calls share (owned by the service).
struct ServiceState;

class IndexerService final : public IndexerServiceBase {
 public:
  // REQUIRES: `engine` outlives the service. Limits come from the engine's
  // config (step_idle_ms, client_quota, client_id_header).
  explicit IndexerService(Engine* engine);
  ~IndexerService() override;

  grpc::ServerUnaryReactor* GetServerInfo(grpc::CallbackServerContext* ctx,
                                          const grpc::ByteBuffer* req,
                                          grpc::ByteBuffer* resp) override;
  grpc::ServerUnaryReactor* Release(grpc::CallbackServerContext* ctx,
                                    const grpc::ByteBuffer* req,
                                    grpc::ByteBuffer* resp) override;
  grpc::ServerUnaryReactor* WriteEntries(grpc::CallbackServerContext* ctx,
                                         const grpc::ByteBuffer* req,
                                         grpc::ByteBuffer* resp) override;
  grpc::ServerBidiReactor<grpc::ByteBuffer, grpc::ByteBuffer>* Step(
      grpc::CallbackServerContext* ctx) override;
  // Regions (SPEC §6 data plane): owned by the caller's identity (see
  // identity.h; without one, "peer:" + the connection's peer address).
  grpc::ServerUnaryReactor* RegisterRegion(grpc::CallbackServerContext* ctx,
                                           const grpc::ByteBuffer* req,
                                           grpc::ByteBuffer* resp) override;
  grpc::ServerUnaryReactor* UnregisterRegion(grpc::CallbackServerContext* ctx,
                                             const grpc::ByteBuffer* req,
                                             grpc::ByteBuffer* resp) override;
  grpc::ServerUnaryReactor* ListRegions(grpc::CallbackServerContext* ctx,
                                        const grpc::ByteBuffer* req,
                                        grpc::ByteBuffer* resp) override;
  // Request rings (ring_host.h): Step messages through a host region of
  // the caller's, attached and detached here. Unregistering a region
  // detaches its ring first.
  grpc::ServerUnaryReactor* AttachRing(grpc::CallbackServerContext* ctx,
                                       const grpc::ByteBuffer* req,
                                       grpc::ByteBuffer* resp) override;
  grpc::ServerUnaryReactor* DetachRing(grpc::CallbackServerContext* ctx,
                                       const grpc::ByteBuffer* req,
                                       grpc::ByteBuffer* resp) override;

  // Lifecycle (lifecycle_service.h): the caller's own sequences, and a
  // sequence's entries as WriteEntries messages.
  grpc::ServerUnaryReactor* ListSequences(grpc::CallbackServerContext* ctx,
                                          const grpc::ByteBuffer* req,
                                          grpc::ByteBuffer* resp) override;
  grpc::ServerWriteReactor<grpc::ByteBuffer>* ExportEntries(grpc::CallbackServerContext* ctx,
                                                            const grpc::ByteBuffer* req) override;

  RegionRegistry& regions();
  // Attached request rings (tests).
  size_t rings() const;
  // Memfds passed over the memfd socket, waiting for RegisterRegion.
  MemfdTokens& memfd_tokens();
  // The memfd socket's path (ServerInfo.memfd_socket; feature
  // "host_regions_memfd" when set). REQUIRES: called before serving.
  void set_memfd_socket(std::string path) { memfd_socket_ = std::move(path); }

  // This process's instance id (32 random hex digits) and start time
  // (ServerInfo.instance_id, start_time_unix_ms).
  const std::string& instance_id() const { return instance_id_; }
  int64_t start_time_unix_ms() const { return start_time_unix_ms_; }

  // For tests: the quotas' view of a client (ClientIdentity form).
  const ClientQuotas& quotas() const;

 private:
  // RegisterRegion's host form with memfd_token.
  absl::StatusOr<uint64_t> RegisterMemfd(const grpc::CallbackServerContext& ctx,
                                         const std::string& owner, const std::string& name,
                                         const v1::HostRegion& h);

  Engine* engine_;
  const std::string instance_id_;
  const int64_t start_time_unix_ms_;
  std::string memfd_socket_;
  std::unique_ptr<ServiceState> state_;
};

}  // namespace indexer

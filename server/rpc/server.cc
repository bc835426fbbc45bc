#include "server/rpc/server.h"

#include <chrono>

#include "absl/strings/str_cat.h"
#include "grpcpp/grpcpp.h"
#include "grpcpp/ext/proto_server_reflection_plugin.h"
#include "grpcpp/health_check_service_interface.h"
#include "server/rpc/credentials.h"
#include "server/rpc/request_log.h"
#include "server/rpc/service.h"
#include "spdlog/spdlog.h"
#include "proto/transport_tuning.h"

namespace indexer {

RunningServer::~RunningServer() { Shutdown(0); }

void RunningServer::Shutdown(int grace_ms) {
  if (shut_down_ || !server_) return;
  shut_down_ = true;
  if (auto* health = server_->GetHealthCheckService()) health->SetServingStatus(false);
  server_->Shutdown(std::chrono::system_clock::now() + std::chrono::milliseconds(grace_ms));
  server_->Wait();
}

void RunningServer::Wait() {
  if (server_) server_->Wait();
}

absl::StatusOr<std::unique_ptr<RunningServer>> StartServer(
    std::unique_ptr<Engine> engine, const std::string& listen) {
  auto security = MakeListenerSecurity(engine->model().config);
  if (!security.ok()) return security.status();
  std::unique_ptr<RunningServer> rs(new RunningServer());
  rs->engine_ = std::move(engine);
  rs->service_ = std::make_unique<IndexerService>(rs->engine_.get());
  grpc::EnableDefaultHealthCheckService(true);
  // Reflection lists indexer.v1.Indexer and grpc.health.v1.Health and serves
  // the wire contract's descriptors (grpcurl, grpc_cli).
  grpc::reflection::InitProtoReflectionServerBuilderPlugin();
  grpc::ServerBuilder builder;
  std::vector<std::unique_ptr<grpc::experimental::ServerInterceptorFactoryInterface>> logs;
  logs.push_back(MakeRequestLogFactory(ClientIdHeader(rs->engine_->model().config)));
  builder.experimental().SetInterceptorCreators(std::move(logs));
  builder.AddListeningPort(listen, security->credentials, &rs->port_);
  // The config's ranges were checked at load (config_check.h): no shift wraps.
  const config::ServerConfig& cfg = rs->engine_->model().config;
  transport::ServerLimits limits;
  limits.max_message_bytes = static_cast<int64_t>(cfg.max_message_mb()) << 20;
  limits.keepalive_ms = static_cast<int64_t>(cfg.keepalive_ms());
  limits.keepalive_timeout_ms = static_cast<int64_t>(cfg.keepalive_timeout_ms());
  limits.memory_quota_bytes = static_cast<int64_t>(cfg.memory_quota_mb()) << 20;
  transport::AddServerArguments(builder, limits);
  builder.RegisterService(rs->service_.get());
  rs->server_ = builder.BuildAndStart();
  if (!rs->server_ || rs->port_ == 0) {
    return absl::UnavailableError(absl::StrCat("listen: cannot bind ", listen));
  }
  rs->server_->GetHealthCheckService()->SetServingStatus(true);
  spdlog::info("listener {}: {}{}", listen,
               security->mutual_tls ? "mutual TLS (client certificates required)"
               : security->tls      ? "TLS"
                                    : "plaintext",
               security->authz ? ", authorization policy enforced" : "");
  return rs;
}

}  // namespace indexer

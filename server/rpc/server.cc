#include "server/rpc/server.h"

#include <algorithm>
#include <chrono>

#include "absl/strings/str_cat.h"
#include "absl/time/time.h"
#include "grpcpp/grpcpp.h"
#include "grpcpp/ext/proto_server_reflection_plugin.h"
#include "grpcpp/health_check_service_interface.h"
#include "server/rpc/credentials.h"
#include "server/rpc/memfd_socket.h"
#include "server/rpc/request_log.h"
#include "server/rpc/service.h"
#include "spdlog/spdlog.h"
#include "proto/transport_tuning.h"

namespace indexer {

RunningServer::~RunningServer() { Shutdown(0); }

void RunningServer::SetNotServing() {
  if (!server_) return;
  if (auto* health = server_->GetHealthCheckService()) health->SetServingStatus(false);
}

void RunningServer::Shutdown(int grace_ms) {
  if (shut_down_ || !server_) return;
  shut_down_ = true;
  SetNotServing();
  server_->Shutdown(std::chrono::system_clock::now() + std::chrono::milliseconds(grace_ms));
  server_->Wait();
  if (memfd_socket_) memfd_socket_->Stop();
  {
    absl::MutexLock lock(&mu_);
    stopping_ = true;
  }
  if (sweeper_.joinable()) sweeper_.join();
}

void RunningServer::OnDeviceError(std::function<void(const absl::Status&)> handler) {
  {
    absl::MutexLock lock(&mu_);
    device_error_handler_ = handler;
  }
  // An error between the start and this call told no one: tell it now.
  if (handler && engine_->device_failed() && !device_error_told_.exchange(true)) {
    handler(absl::UnavailableError("device: a sticky device error happened before the handler "
                                   "was set"));
  }
}

void RunningServer::SweepLoop(std::chrono::milliseconds tick) {
  absl::MutexLock lock(&mu_);
  while (!mu_.AwaitWithTimeout(absl::Condition(&stopping_), absl::FromChrono(tick))) {
    mu_.Unlock();  // the sweep takes the engine's lock only
    const int64_t n = engine_->ReleaseIdle(std::chrono::steady_clock::now());
    if (n > 0) spdlog::info("idle TTL: released {} sequences", n);
    mu_.Lock();
  }
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
  RunningServer* const handler_owner = rs.get();
  // A sticky device error: NOT_SERVING at once, then the owner is told.
  rs->engine_->SetDeviceErrorHandler([raw = handler_owner](const absl::Status& s) {
    spdlog::error("sticky device error: {}; NOT_SERVING, stopping", s.ToString());
    raw->SetNotServing();
    std::function<void(const absl::Status&)> handler;
    {
      absl::MutexLock lock(&raw->mu_);
      handler = raw->device_error_handler_;
    }
    if (handler && !raw->device_error_told_.exchange(true)) handler(s);
  });

  const std::string memfd_path =
      MemfdSocketPath(rs->engine_->model().config.memfd_socket(), listen);
  if (!memfd_path.empty()) {
    auto memfd = MemfdSocket::Start(memfd_path, &rs->service_->memfd_tokens());
    if (!memfd.ok()) return memfd.status();
    rs->memfd_socket_ = *std::move(memfd);
    rs->service_->set_memfd_socket(memfd_path);
    spdlog::info("memfd socket {} (host regions by memfd)", memfd_path);
  }

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
  if (const uint64_t ttl = cfg.sequence_idle_ttl_ms(); ttl > 0) {
    // Released within ttl + tick: an eighth of the TTL, 10 ms to 1 s.
    const auto tick = std::chrono::milliseconds(std::clamp<uint64_t>(ttl / 8, 10, 1000));
    rs->sweeper_ = std::thread([raw = handler_owner, tick] { raw->SweepLoop(tick); });
  }
  spdlog::info("listener {}: {}{}", listen,
               security->mutual_tls ? "mutual TLS (client certificates required)"
               : security->tls      ? "TLS"
                                    : "plaintext",
               security->authz ? ", authorization policy enforced" : "");
  return rs;
}

}  // namespace indexer

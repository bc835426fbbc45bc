// The gRPC transport: a thin layer over server/core's Engine. Builds the
// service, the health service and the listening server.
#pragma once

#include <atomic>
#include <functional>
#include <memory>
#include <string>
#include <thread>

#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"
#include "server/core/engine.h"

namespace grpc {
class Server;
}

namespace indexer {

class IndexerService;
class MemfdSocket;

class RunningServer {
 public:
  ~RunningServer();
  // Port actually bound (useful with "host:0").
  int port() const { return port_; }
  Engine& engine() { return *engine_; }
  IndexerService& service() { return *service_; }
  // The first phase of a drain (README "Lifecycle"): health turns
  // NOT_SERVING for probes and routers while every call is still served.
  // Idempotent; thread-safe.
  void SetNotServing();
  // Marks the daemon NOT_SERVING, stops accepting and waits up to
  // `grace_ms` for open steps before cancelling them. Idempotent.
  void Shutdown(int grace_ms = 5000);
  // Blocks until Shutdown.
  void Wait();
  // Called once, on the failing call's thread, after a sticky device error
  // has turned the daemon NOT_SERVING (Engine::SetDeviceErrorHandler); the
  // daemon's owner ends it (main: exit status 3). Called at once when the
  // error came before this call. Thread-safe.
  void OnDeviceError(std::function<void(const absl::Status&)> handler);

 private:
  friend absl::StatusOr<std::unique_ptr<RunningServer>> StartServer(
      std::unique_ptr<Engine>, const std::string&);
  RunningServer() = default;
  std::unique_ptr<Engine> engine_;
  std::unique_ptr<IndexerService> service_;
  std::unique_ptr<grpc::Server> server_;
  // The memfd socket (config memfd_socket), when there is one. Declared
  // after service_: it feeds the service's tokens and goes first.
  std::unique_ptr<MemfdSocket> memfd_socket_;
  int port_ = 0;
  bool shut_down_ = false;
  // The idle-TTL sweep (Engine::ReleaseIdle), when the TTL is on.
  void SweepLoop(std::chrono::milliseconds tick);
  std::thread sweeper_;
  absl::Mutex mu_;
  bool stopping_ ABSL_GUARDED_BY(mu_) = false;
  std::function<void(const absl::Status&)> device_error_handler_ ABSL_GUARDED_BY(mu_);
  std::atomic<bool> device_error_told_{false};  // the handler runs at most once
};

// Starts serving `engine` on `listen` ("host:port"; port 0 picks one), and
// the memfd socket the config names (MemfdSocketPath in memfd_socket.h).
absl::StatusOr<std::unique_ptr<RunningServer>> StartServer(
    std::unique_ptr<Engine> engine, const std::string& listen);

}  // namespace indexer

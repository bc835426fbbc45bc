// The gRPC transport: a thin layer over server/core's Engine. Builds the
// service, the health service and the listening server.
#pragma once

#include <memory>
#include <string>

#include "absl/status/statusor.h"
#include "server/core/engine.h"

namespace grpc {
class Server;
}

namespace indexer {

class IndexerService;

class RunningServer {
 public:
  ~RunningServer();
  // Port actually bound (useful with "host:0").
  int port() const { return port_; }
  Engine& engine() { return *engine_; }
  // Marks the daemon NOT_SERVING, stops accepting and waits up to
  // `grace_ms` for open steps before cancelling them. Idempotent.
  void Shutdown(int grace_ms = 5000);
  // Blocks until Shutdown.
  void Wait();

 private:
  friend absl::StatusOr<std::unique_ptr<RunningServer>> StartServer(
      std::unique_ptr<Engine>, const std::string&);
  RunningServer() = default;
  std::unique_ptr<Engine> engine_;
  std::unique_ptr<IndexerService> service_;
  std::unique_ptr<grpc::Server> server_;
  int port_ = 0;
  bool shut_down_ = false;
};

// Starts serving `engine` on `listen` ("host:port"; port 0 picks one).
absl::StatusOr<std::unique_ptr<RunningServer>> StartServer(
    std::unique_ptr<Engine> engine, const std::string& listen);

}  // namespace indexer

// The metrics endpoint: Prometheus text exposition over HTTP
// (GET /metrics), served by Debian's cpp-httplib on a listener of its own
// (`indexerd --metrics-listen host:port`), apart from the gRPC port.
#pragma once

#include <memory>
#include <string>
#include <thread>

#include "absl/status/statusor.h"
#include "server/core/engine.h"

namespace httplib {
class Server;
}

namespace indexer {

class MetricsHttp {
 public:
  // Serves `engine`'s metrics on `listen` ("host:port", "[v6]:port"; port 0
  // picks one). UNAVAILABLE naming the address when it cannot bind.
  // REQUIRES: `engine` outlives the returned object.
  static absl::StatusOr<std::unique_ptr<MetricsHttp>> Start(const std::string& listen,
                                                            Engine* engine);
  ~MetricsHttp();  // stops serving, joins the listener

  int port() const { return port_; }

 private:
  MetricsHttp() = default;
  std::unique_ptr<httplib::Server> server_;
  std::thread thread_;
  int port_ = 0;
};

// The exposition text of `engine` (what GET /metrics answers).
std::string RenderMetrics(Engine& engine);

}  // namespace indexer

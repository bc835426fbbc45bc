#include "server/http/metrics_http.h"

#include <atomic>
#include <cstdlib>
#include <memory>

#include <sys/socket.h>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "httplib.h"

namespace indexer {
namespace {

struct HostPort {
  std::string host;
  int port = 0;
};

absl::StatusOr<HostPort> ParseListen(const std::string& listen) {
  const size_t colon = listen.rfind(':');
  HostPort hp;
  uint32_t port = 0;
  if (colon == std::string::npos || colon == 0 ||
      !absl::SimpleAtoi(listen.substr(colon + 1), &port) || port > 65535) {
    return absl::InvalidArgumentError(
        absl::StrCat("metrics_listen: expected host:port (port 0..65535), got \"", listen, "\""));
  }
  hp.host = listen.substr(0, colon);
  if (hp.host.size() >= 2 && hp.host.front() == '[' && hp.host.back() == ']') {
    hp.host = hp.host.substr(1, hp.host.size() - 2);
  }
  hp.port = static_cast<int>(port);
  return hp;
}

}  // namespace

std::string RenderMetrics(Engine& engine) {
  return engine.metrics().Render(engine.Gauges(), engine.model().config.profile(),
                                 engine.backend().Describe());
}

absl::StatusOr<std::unique_ptr<MetricsHttp>> MetricsHttp::Start(const std::string& listen,
                                                                Engine* engine) {
  auto hp = ParseListen(listen);
  if (!hp.ok()) return hp.status();
  std::unique_ptr<MetricsHttp> m(new MetricsHttp());
  m->server_ = std::make_unique<httplib::Server>();
  // Scrapes are rare and small: two workers, not one per core.
  m->server_->new_task_queue = [] { return new httplib::ThreadPool(2); };
  // SO_REUSEADDR only: httplib's default SO_REUSEPORT would let a second
  // daemon bind the same port and take half the scrapes.
  m->server_->set_socket_options([](socket_t sock) {
    int yes = 1;
    setsockopt(sock, SOL_SOCKET, SO_REUSEADDR, &yes, sizeof(yes));
  });
  m->server_->set_read_timeout(5, 0);
  m->server_->set_write_timeout(5, 0);
  m->server_->Get("/metrics", [engine](const httplib::Request&, httplib::Response& res) {
    res.set_content(RenderMetrics(*engine), "text/plain; version=0.0.4; charset=utf-8");
  });
  if (hp->port == 0) {
    m->port_ = m->server_->bind_to_any_port(hp->host);
  } else if (m->server_->bind_to_port(hp->host, hp->port)) {
    m->port_ = hp->port;
  } else {
    m->port_ = -1;
  }
  if (m->port_ <= 0) {
    return absl::UnavailableError(absl::StrCat("metrics_listen: cannot bind ", listen));
  }
  httplib::Server* server = m->server_.get();
  auto ended = std::make_shared<std::atomic<bool>>(false);
  m->thread_ = std::thread([server, ended] {
    server->listen_after_bind();
    ended->store(true);
  });
  // stop() only closes a listener that already runs: wait until it does,
  // so that a destructor right after Start cannot leave it running.
  while (!server->is_running() && !ended->load()) std::this_thread::yield();
  return m;
}

MetricsHttp::~MetricsHttp() {
  if (server_) server_->stop();
  if (thread_.joinable()) thread_.join();
}

}  // namespace indexer

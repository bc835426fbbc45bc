// indexerd: serves the sparse-attention indexer of one model profile.
//
//   indexerd --profile demo [--device auto|cpu|gpu:N] [--listen ADDR]
//            [--cache-mb N] [--threads N] [--config FILE] [--port-file FILE]
//            [--metrics-listen ADDR [--metrics-port-file FILE]]
//            [--tls-cert PEM --tls-key PEM [--tls-ca PEM]] [--authz-policy JSON]
//            [--drain-ms N] [--drain-delay-ms N]
//   indexerd --check-config [PROFILE|FILE]   validate, print the geometry, exit
//
// Listens on 127.0.0.1:50061 unless --listen or the config says otherwise.
// Exit status: 0 after a drain on SIGTERM/SIGINT, 1 when a port file
// cannot be written, 2 for a config or start-up error, 3 after a sticky
// device error (SPEC §9).
#include <algorithm>
#include <cerrno>
#include <csignal>
#include <cstring>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <pthread.h>
#include <unistd.h>

#include "CLI/CLI.hpp"
#include "kernels/backend.h"
#include "server/core/config_check.h"
#include "server/core/config_report.h"
#include "server/core/engine.h"
#include "server/core/fault_injection.h"
#include "server/core/model.h"
#include "server/http/metrics_http.h"
#include "server/install_paths.h"
#include "server/rpc/log_format.h"
#include "server/rpc/server.h"
#include "spdlog/spdlog.h"
#include "proto/transport_tuning.h"

namespace {

std::string ResolveConfig(const std::string& config, const std::string& profile,
                          const std::string& dir) {
  if (!config.empty()) return config;
  return (std::filesystem::path(dir) / (profile + ".textproto")).string();
}

// The K pools against what the device can hold, before they are allocated:
// host memory for the cpu backend (calloc would succeed lazily on an
// overcommitting host and fail page by page later), the device's free
// memory for a GPU.
absl::Status CheckCacheFitsDevice(const indexer::Model& model, const indexer::Backend& b) {
  if (b.Kind() == "cpu") {
    auto avail = indexer::HostAvailableBytes();
    if (!avail.ok()) return absl::OkStatus();  // nothing to compare with
    return indexer::CheckCacheFits(model, *avail, "host memory (MemAvailable)");
  }
  auto free = b.FreeDeviceMemory();
  if (!free.ok()) {
    if (free.status().code() == absl::StatusCode::kNotFound) return absl::OkStatus();
    return free.status();
  }
  return indexer::CheckCacheFits(model, *free, b.Describe() + " free memory");
}

int Run(int argc, char** argv) {
  CLI::App app{"indexerd: sparse-attention indexer daemon (gRPC, indexer.v1)"};
  std::string config, profile = "demo", listen, device, log_level = "info", port_file;
  const char* env_dir = std::getenv("INDEXERD_CONFIG_DIR");
  std::string config_dir = env_dir ? env_dir : indexer::DefaultConfigDir();
  std::string check_config, metrics_listen, metrics_port_file, log_format = "text", memfd_socket;
  uint64_t cache_mb = 0;
  int threads = -1;
  int grace_ms = 10000;
  int64_t drain_delay_ms = -1;
  std::string tls_cert, tls_key, tls_ca, authz_policy, client_id_header;
  int tls_refresh_s = -1;
  app.add_option("--profile", profile, "Model profile: a file <name>.textproto in --config-dir")
      ->capture_default_str();
  app.add_option("--config", config, "Config file (text-format ServerConfig); overrides --profile");
  app.add_option("--config-dir", config_dir, "Where profiles live (env INDEXERD_CONFIG_DIR)")
      ->capture_default_str();
  app.add_option("--check-config", check_config,
                 "Validate a profile (a name in --config-dir, or a file), print its resolved "
                 "geometry and exit (0 = valid); without a value, the --profile/--config one")
      ->expected(0, 1);
  app.add_option("--listen", listen,
                 "host:port to listen on (port 0 = any); default from config, else "
                 "127.0.0.1:50061");
  app.add_option("--memfd-socket", memfd_socket,
                 "Unix socket where local clients pass memfds for host regions; default from "
                 "config, else <path>.fd for a unix:<path> listener, else none; \"off\" = none");
  CLI::Option* metrics_opt = app.add_option(
      "--metrics-listen", metrics_listen,
      "host:port for Prometheus metrics over HTTP (GET /metrics); default off");
  app.add_option("--metrics-port-file", metrics_port_file,
                 "Write the metrics port (e.g. of --metrics-listen 127.0.0.1:0) to this file "
                 "once serving")
      ->needs(metrics_opt);
  app.add_option("--device", device, "auto, cpu, gpu or gpu:N; default from config (auto)");
  app.add_option("--cache-mb", cache_mb, "K cache size over all layers, MiB; default from config");
  app.add_option("--threads", threads, "cpu backend threads (0 = all cores)");
  app.add_option("--port-file", port_file, "Write the bound port to this file once serving");
  app.add_option("--drain-ms", grace_ms, "Grace period for open steps on SIGTERM")
      ->capture_default_str();
  app.add_option("--drain-delay-ms", drain_delay_ms,
                 "On SIGTERM, NOT_SERVING for this long before the drain (config "
                 "drain_delay_ms, default 2000; a second signal skips it)")
      ->check(CLI::Range(int64_t{0}, int64_t{600000}));
  app.add_option("--tls-cert", tls_cert,
                 "Server certificate chain (PEM); with --tls-key serves TLS (config tls.cert_file)");
  app.add_option("--tls-key", tls_key, "Its private key (PEM) (config tls.key_file)");
  app.add_option("--tls-ca", tls_ca,
                 "Client CA bundle (PEM): mutual TLS, client certificates required "
                 "(config tls.ca_file)");
  app.add_option("--tls-refresh-s", tls_refresh_s,
                 "Re-read the certificate files this often (config tls.refresh_s, default 60)")
      ->check(CLI::Range(1, 86400));
  app.add_option("--authz-policy", authz_policy,
                 "gRPC authorization policy file (JSON) (config authz_policy_file)");
  app.add_option("--client-id-header", client_id_header,
                 "Metadata key naming the client on plaintext (default x-indexer-client)");
  app.add_option("--log-level", log_level, "trace, debug, info, warn, error")
      ->capture_default_str();
  app.add_option("--log-format", log_format,
                 "text, or json: one JSON object per line (time, level, msg, and per call "
                 "method, request_id, traceparent, client, code, ms)")
      ->capture_default_str();
  CLI11_PARSE(app, argc, argv);
  spdlog::set_level(spdlog::level::from_str(log_level));
  if (absl::Status f = indexer::SetLogFormat(log_format); !f.ok()) {
    std::fprintf(stderr, "%s\n", std::string(f.message()).c_str());
    return 2;
  }

  // Signals are taken by sigwait below, so block them in every thread.
  // SIGUSR1 is the daemon's own: a sticky device error.
  sigset_t sigs;
  sigemptyset(&sigs);
  sigaddset(&sigs, SIGINT);
  sigaddset(&sigs, SIGTERM);
  sigaddset(&sigs, SIGUSR1);
  pthread_sigmask(SIG_BLOCK, &sigs, nullptr);

  const bool check_only = app.count("--check-config") > 0;
  if (check_only && !check_config.empty()) {
    // A path names a file; a bare word a profile.
    const bool is_file = check_config.find('/') != std::string::npos ||
                         check_config.ends_with(".textproto");
    if (is_file) {
      config = check_config;
    } else {
      config.clear();
      profile = check_config;
    }
  }
  const std::string path = ResolveConfig(config, profile, config_dir);
  auto cfg = indexer::LoadConfigFile(path);
  if (!cfg.ok()) {
    spdlog::error("{}", cfg.status().ToString());
    return 2;
  }
  if (!listen.empty()) cfg->set_listen(listen);
  if (!memfd_socket.empty()) cfg->set_memfd_socket(memfd_socket);
  if (!device.empty()) cfg->set_device(device);
  if (cache_mb) cfg->set_cache_mb(cache_mb);
  if (threads >= 0) cfg->set_threads(static_cast<uint32_t>(threads));
  if (!tls_cert.empty()) cfg->mutable_tls()->set_cert_file(tls_cert);
  if (!tls_key.empty()) cfg->mutable_tls()->set_key_file(tls_key);
  if (!tls_ca.empty()) cfg->mutable_tls()->set_ca_file(tls_ca);
  if (tls_refresh_s >= 0) cfg->mutable_tls()->set_refresh_s(static_cast<uint32_t>(tls_refresh_s));
  if (!authz_policy.empty()) cfg->set_authz_policy_file(authz_policy);
  if (!client_id_header.empty()) cfg->set_client_id_header(client_id_header);
  if (drain_delay_ms >= 0) cfg->set_drain_delay_ms(static_cast<uint64_t>(drain_delay_ms));
  auto model = indexer::BuildModel(*std::move(cfg));
  if (!model.ok()) {
    spdlog::error("config {}: {}", path, model.status().ToString());
    return 2;
  }
  if (check_only) {
    // No backend, no listener: what the profile resolves to, for sizing.
    std::printf("config %s: valid\n%s", path.c_str(), indexer::DescribeGeometry(*model).c_str());
    return 0;
  }
  auto backend = indexer::MakeBackend(model->config.device(),
                                      static_cast<int>(model->config.threads()));
  if (!backend.ok()) {
    spdlog::error("{}", backend.status().ToString());
    return 2;
  }
  if (absl::Status fits = CheckCacheFitsDevice(*model, **backend); !fits.ok()) {
    spdlog::error("{}", fits.ToString());
    return 2;
  }
  if (const char* fault = std::getenv(indexer::kDeviceFaultEnv); fault != nullptr && *fault) {
    // Test-only (fault_injection.h): never set in production.
    const int64_t after = std::strtoll(fault, nullptr, 10);
    spdlog::warn("{}={}: TEST-ONLY sticky device error after {} layers", indexer::kDeviceFaultEnv,
                 fault, after);
    *backend = indexer::MakeFaultInjectingBackend(*std::move(backend), after);
  }
  const std::string listen_addr = model->config.listen();
  const std::string profile_name = model->config.profile();
  const indexer::Model model_copy = *model;
  auto engine = indexer::Engine::Create(*std::move(model), *std::move(backend));
  if (!engine.ok() && engine.status().code() == absl::StatusCode::kFailedPrecondition &&
      model_copy.config.device() == "auto") {
    // auto picked a GPU whose backend lacks a path this profile needs.
    spdlog::warn("{}; device auto falls back to the cpu backend",
                 std::string(engine.status().message()));
    backend = indexer::MakeBackend("cpu", static_cast<int>(model_copy.config.threads()));
    if (!backend.ok()) {
      spdlog::error("{}", backend.status().ToString());
      return 2;
    }
    if (absl::Status fits = CheckCacheFitsDevice(model_copy, **backend); !fits.ok()) {
      spdlog::error("{}", fits.ToString());
      return 2;
    }
    engine = indexer::Engine::Create(model_copy, *std::move(backend));
  }
  if (!engine.ok()) {
    spdlog::error("{}", engine.status().ToString());
    return 2;
  }
  const std::string device_desc = (*engine)->backend().Describe();
  const int64_t drain_delay = static_cast<int64_t>((*engine)->model().config.drain_delay_ms());

  for (const auto& g : (*engine)->model().groups) {
    spdlog::info("group {}: {} layers, {} D={} E={} r={} {}, {} pages/layer ({:.1f} MiB)",
                 g.name, g.layers.size(), indexer::KvFormatName(g.layout.format),
                 g.layout.head_dim, g.layout.page_entries, g.compress_ratio, g.layout_name,
                 g.pages, g.pages * g.layout.page_bytes() * g.layers.size() / 1048576.0);
  }
  auto server = indexer::StartServer(*std::move(engine), listen_addr);
  if (!server.ok()) {
    spdlog::error("{}", server.status().ToString());
    return 2;
  }
  const int port = (*server)->port();
  spdlog::info("indexerd serving profile '{}' on {} (port {}) with device {}", profile_name,
               listen_addr, port, device_desc);
  std::unique_ptr<indexer::MetricsHttp> metrics;  // stops before the server goes
  if (!metrics_listen.empty()) {
    auto m = indexer::MetricsHttp::Start(metrics_listen, &(*server)->engine());
    if (!m.ok()) {
      spdlog::error("{}", m.status().ToString());
      (*server)->Shutdown(0);
      return 2;
    }
    metrics = *std::move(m);
    spdlog::info("metrics on http://{}/metrics (port {})", metrics_listen, metrics->port());
  }
  // Whoever waits on a port file would wait forever: stop instead. The
  // metrics port's file first, so that the gRPC one, once there, says both
  // listeners serve.
  auto write_port = [&](const char* flag, const std::string& file, int value) {
    if (file.empty()) return true;
    std::ofstream out(file);
    out << value << "\n";
    out.close();
    if (out) return true;
    spdlog::error("{}: cannot write {}: {}; stopping", flag, file, std::strerror(errno));
    return false;
  };
  if (!write_port("--metrics-port-file", metrics_port_file, metrics ? metrics->port() : 0) ||
      !write_port("--port-file", port_file, port)) {
    (*server)->Shutdown(0);
    return 1;
  }

  // The handler runs on a layer's thread: it only wakes the sigwait below.
  (*server)->OnDeviceError([](const absl::Status&) { kill(getpid(), SIGUSR1); });

  int sig = 0;
  sigwait(&sigs, &sig);
  if (sig == SIGUSR1) {
    // NOT_SERVING already (RunningServer); open steps fail on the device
    // anyway, so no delay: drain briefly and end with a non-zero status.
    spdlog::error("sticky device error: stopping (exit status 3)");
    (*server)->Shutdown(std::min(grace_ms, 1000));
    return 3;
  }
  // Two-phase drain: NOT_SERVING first while every call is still served,
  // so that probes and routers move traffic away; then the drain of open
  // steps. A second SIGTERM/SIGINT skips the rest of the delay.
  (*server)->SetNotServing();
  spdlog::info("signal {}: NOT_SERVING; draining in {} ms (up to {} ms for open steps)", sig,
               drain_delay, grace_ms);
  if (drain_delay > 0) {
    const timespec wait = {static_cast<time_t>(drain_delay / 1000),
                           static_cast<long>(drain_delay % 1000) * 1000000};
    siginfo_t info;
    int got;
    do {
      got = sigtimedwait(&sigs, &info, &wait);  // EINTR: a non-blocked signal; wait again
    } while (got < 0 && errno == EINTR);
    if (got == SIGUSR1) {
      spdlog::error("sticky device error while draining: stopping (exit status 3)");
      (*server)->Shutdown(std::min(grace_ms, 1000));
      return 3;
    }
    if (got > 0) spdlog::info("signal {}: drain delay skipped", got);
  }
  spdlog::info("draining open steps (up to {} ms)", grace_ms);
  (*server)->Shutdown(grace_ms);
  spdlog::info("stopped");
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  // Before any thread allocates: keeps per-layer tensors off mmap (see tuning.h).
  indexer::transport::TuneAllocator();
  return Run(argc, argv);
}

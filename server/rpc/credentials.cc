#include "server/rpc/credentials.h"

#include <algorithm>
#include <cctype>
#include <fstream>

#include "absl/strings/escaping.h"
#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "grpcpp/security/tls_certificate_provider.h"
#include "grpcpp/security/tls_credentials_options.h"
#include "server/rpc/authz.h"

namespace indexer {
namespace {

constexpr uint32_t kDefaultRefreshS = 60;
constexpr uint32_t kMaxRefreshS = 86400;

// The file watcher reports unreadable files only in gRPC's log and then
// fails every handshake; checking here turns that into a start-up error.
absl::Status CheckPemFile(const std::string& field, const std::string& path) {
  std::ifstream f(path, std::ios::binary);
  // PEM may follow text (openssl's "Bag Attributes"); 1 MiB covers any chain.
  std::string text(1 << 20, '\0');
  if (!f) {
    return absl::InvalidArgumentError(
        absl::StrCat(field, ": expected a readable PEM file, got '", path, "'"));
  }
  f.read(text.data(), static_cast<std::streamsize>(text.size()));
  text.resize(static_cast<size_t>(f.gcount()));
  if (text.find("-----BEGIN") == std::string::npos) {
    return absl::InvalidArgumentError(
        absl::StrCat(field, ": expected PEM ('-----BEGIN'), got another format in '", path, "'"));
  }
  return absl::OkStatus();
}

}  // namespace

std::string ClientIdHeader(const config::ServerConfig& cfg) {
  std::string h = cfg.client_id_header().empty() ? "x-indexer-client" : cfg.client_id_header();
  for (char& c : h) c = static_cast<char>(std::tolower(static_cast<unsigned char>(c)));
  return h;
}

absl::StatusOr<ListenerSecurity> MakeListenerSecurity(const config::ServerConfig& cfg) {
  ListenerSecurity sec;
  const config::Tls& tls = cfg.tls();
  if (tls.cert_file().empty() != tls.key_file().empty()) {
    return absl::InvalidArgumentError(
        absl::StrCat("tls: expected cert_file and key_file together, got ",
                     tls.cert_file().empty() ? "key_file alone" : "cert_file alone"));
  }
  if (tls.cert_file().empty() && !tls.ca_file().empty()) {
    return absl::InvalidArgumentError(
        "tls.ca_file: mutual TLS expects cert_file and key_file too");
  }
  if (tls.refresh_s() > kMaxRefreshS) {
    return absl::InvalidArgumentError(absl::StrCat("tls.refresh_s: expected 0..", kMaxRefreshS,
                                                   " (0 = 60), got ", tls.refresh_s()));
  }
  const uint32_t refresh_s = tls.refresh_s() ? tls.refresh_s() : kDefaultRefreshS;
  // client_id_header was checked and lower-cased with the config
  // (server/core/config_check.cc).
  if (tls.cert_file().empty()) {
    sec.credentials = grpc::InsecureServerCredentials();
  } else {
    if (auto s = CheckPemFile("tls.cert_file", tls.cert_file()); !s.ok()) return s;
    if (auto s = CheckPemFile("tls.key_file", tls.key_file()); !s.ok()) return s;
    if (!tls.ca_file().empty()) {
      if (auto s = CheckPemFile("tls.ca_file", tls.ca_file()); !s.ok()) return s;
    }
    sec.tls = true;
    sec.mutual_tls = !tls.ca_file().empty();
    auto provider = std::make_shared<grpc::experimental::FileWatcherCertificateProvider>(
        tls.key_file(), tls.cert_file(), tls.ca_file(), refresh_s);
    grpc::experimental::TlsServerCredentialsOptions options(provider);
    options.watch_identity_key_cert_pairs();
    if (sec.mutual_tls) {
      options.watch_root_certs();
      options.set_cert_request_type(GRPC_SSL_REQUEST_AND_REQUIRE_CLIENT_CERTIFICATE_AND_VERIFY);
    } else {
      options.set_cert_request_type(GRPC_SSL_DONT_REQUEST_CLIENT_CERTIFICATE);
    }
    sec.credentials = grpc::experimental::TlsServerCredentials(options);
    if (!sec.credentials) {
      return absl::InvalidArgumentError("tls: gRPC refused the TLS credentials options");
    }
  }
  if (!cfg.authz_policy_file().empty()) {
    // The policy is enforced by the credentials' metadata processor, which
    // gRPC's insecure credentials do not run (see authz.h).
    if (!sec.tls) {
      return absl::InvalidArgumentError(
          "authz_policy_file: expected tls.cert_file and tls.key_file too (a policy is "
          "enforced on TLS listeners only)");
    }
    auto policy = AuthzPolicy::Load(cfg.authz_policy_file(), refresh_s);
    if (!policy.ok()) return policy.status();
    sec.authz = *std::move(policy);
    sec.credentials->SetAuthMetadataProcessor(MakeAuthzProcessor(sec.authz));
  }
  return sec;
}

}  // namespace indexer

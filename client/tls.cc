// Client-side TLS (SPEC §9): channel credentials from PEM files.
#include <fstream>
#include <sstream>

#include "absl/strings/str_cat.h"
#include "indexer/client.h"

namespace indexer::client {
namespace {

absl::StatusOr<std::string> ReadPem(const std::string& option, const std::string& path) {
  std::ifstream f(path, std::ios::binary);
  if (!f) {
    return absl::InvalidArgumentError(
        absl::StrCat(option, ": expected a readable PEM file, got '", path, "'"));
  }
  std::ostringstream ss;
  ss << f.rdbuf();
  if (ss.str().find("-----BEGIN") == std::string::npos) {
    return absl::InvalidArgumentError(
        absl::StrCat(option, ": expected PEM ('-----BEGIN'), got another format in '", path,
                     "'"));
  }
  return ss.str();
}

}  // namespace

absl::StatusOr<std::shared_ptr<grpc::ChannelCredentials>> MakeTlsCredentials(
    const TlsOptions& tls) {
  if (tls.cert_file.empty() != tls.key_file.empty()) {
    return absl::InvalidArgumentError(absl::StrCat(
        "tls: expected cert_file and key_file together, got ",
        tls.cert_file.empty() ? "key_file alone" : "cert_file alone"));
  }
  grpc::SslCredentialsOptions ssl;
  if (!tls.ca_file.empty()) {
    auto ca = ReadPem("tls.ca_file", tls.ca_file);
    if (!ca.ok()) return ca.status();
    ssl.pem_root_certs = *std::move(ca);
  }
  if (!tls.cert_file.empty()) {
    auto cert = ReadPem("tls.cert_file", tls.cert_file);
    if (!cert.ok()) return cert.status();
    auto key = ReadPem("tls.key_file", tls.key_file);
    if (!key.ok()) return key.status();
    ssl.pem_cert_chain = *std::move(cert);
    ssl.pem_private_key = *std::move(key);
  }
  std::shared_ptr<grpc::ChannelCredentials> creds = grpc::SslCredentials(ssl);
  if (!creds) return absl::InternalError("tls: gRPC could not create SSL credentials");
  return creds;
}

}  // namespace indexer::client

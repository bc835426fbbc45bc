// indexer-cli health: one grpc.health.v1.Health/Check call, for container
// HEALTHCHECKs and scripts. Exit status 0 only when the daemon answers
// SERVING, so `indexer-cli health` can be a probe command as it is.
//
// The two messages are encoded by hand (HealthCheckRequest{string service =
// 1}, HealthCheckResponse{ServingStatus status = 1}) and sent through a
// generic stub: Debian ships health.proto in grpc-proto, not as a library,
// and two one-field messages do not justify generating stubs.
#include <condition_variable>
#include <cstdio>
#include <mutex>
#include <string>
#include <vector>

#include <grpcpp/create_channel.h>
#include <grpcpp/generic/generic_stub.h>
#include <grpcpp/support/byte_buffer.h>

#include "absl/strings/str_cat.h"
#include "client/cli_common.h"
#include "kernels/common/status_macros.h"

namespace indexer::client::cli {
namespace {

// grpc.health.v1.HealthCheckResponse.ServingStatus.
const char* ServingStatusName(uint64_t status) {
  switch (status) {
    case 0: return "UNKNOWN";
    case 1: return "SERVING";
    case 2: return "NOT_SERVING";
    case 3: return "SERVICE_UNKNOWN";
    default: return "UNRECOGNIZED";
  }
}

std::string EncodeRequest(const std::string& service) {
  std::string out;
  if (service.empty()) return out;  // proto3: the default is not written
  out.push_back(0x0a);              // field 1, length-delimited
  for (uint64_t n = service.size(); ; n >>= 7) {
    if (n < 0x80) { out.push_back(static_cast<char>(n)); break; }
    out.push_back(static_cast<char>((n & 0x7f) | 0x80));
  }
  return out + service;
}

// The response's status field; absent = 0 (UNKNOWN). Unknown fields are
// skipped as protobuf does, so a newer server's extra fields do not fail it.
absl::StatusOr<uint64_t> DecodeStatus(const std::string& bytes) {
  uint64_t status = 0;
  size_t i = 0;
  auto varint = [&](uint64_t& v) -> bool {
    v = 0;
    for (int shift = 0; shift < 64 && i < bytes.size(); shift += 7) {
      uint8_t b = static_cast<uint8_t>(bytes[i++]);
      v |= uint64_t{b & 0x7fu} << shift;
      if (!(b & 0x80)) return true;
    }
    return false;
  };
  while (i < bytes.size()) {
    uint64_t key, value;
    if (!varint(key)) break;
    switch (key & 7) {
      case 0:
        if (!varint(value)) break;
        if (key >> 3 == 1) status = value;
        continue;
      case 2:
        if (!varint(value) || value > bytes.size() - i) break;
        i += value;
        continue;
      case 1: if (bytes.size() - i < 8) break; i += 8; continue;
      case 5: if (bytes.size() - i < 4) break; i += 4; continue;
      default: break;
    }
    return absl::DataLossError(absl::StrCat(
        "health: expected a HealthCheckResponse, got ", bytes.size(), " bytes that do not parse"));
  }
  return status;
}

}  // namespace

absl::StatusOr<bool> RunHealth(const GlobalFlags& flags, const HealthFlags& health) {
  grpc::ChannelArguments args;
  std::shared_ptr<grpc::ChannelCredentials> credentials = grpc::InsecureChannelCredentials();
  if (!flags.tls_ca.empty() || !flags.tls_cert.empty() || !flags.tls_key.empty() ||
      !flags.tls_server_name.empty()) {
    ASSIGN_OR_RETURN(credentials, MakeTlsCredentials(TlsOptions{
                                      flags.tls_ca, flags.tls_cert, flags.tls_key,
                                      flags.tls_server_name}));
    if (!flags.tls_server_name.empty()) args.SetSslTargetNameOverride(flags.tls_server_name);
  }
  std::shared_ptr<grpc::Channel> channel =
      grpc::CreateCustomChannel(flags.addr, credentials, args);
  grpc::GenericStub stub(channel);
  grpc::ClientContext context;
  // One deadline covers connecting and the answer: a probe must not hang.
  context.set_deadline(std::chrono::system_clock::now() +
                       std::chrono::milliseconds(static_cast<int64_t>(health.timeout_s * 1000)));
  context.set_wait_for_ready(true);  // a daemon still starting is waited for, up to the deadline
  if (!flags.client_id.empty()) context.AddMetadata(flags.client_id_header, flags.client_id);

  std::string request_bytes = EncodeRequest(health.service);
  grpc::Slice slice(request_bytes);
  grpc::ByteBuffer request(&slice, 1);
  grpc::ByteBuffer response;
  std::mutex mu;
  std::condition_variable cv;
  bool done = false;
  grpc::Status status;
  stub.UnaryCall(&context, "/grpc.health.v1.Health/Check", grpc::StubOptions(), &request,
                 &response, [&](grpc::Status s) {
                   std::lock_guard<std::mutex> lock(mu);
                   status = std::move(s);
                   done = true;
                   cv.notify_one();
                 });
  {
    std::unique_lock<std::mutex> lock(mu);
    cv.wait(lock, [&] { return done; });
  }
  if (!status.ok()) {
    return absl::Status(static_cast<absl::StatusCode>(status.error_code()),
                        absl::StrCat("health check of ", flags.addr, " (service \"",
                                     health.service, "\"): ", status.error_message()));
  }
  std::vector<grpc::Slice> slices;
  if (!response.Dump(&slices).ok()) return absl::DataLossError("health: unreadable response");
  std::string bytes;
  for (const grpc::Slice& s : slices) bytes.append(reinterpret_cast<const char*>(s.begin()), s.size());
  ASSIGN_OR_RETURN(uint64_t serving, DecodeStatus(bytes));
  std::printf("%s\n", ServingStatusName(serving));
  return serving == 1;
}

}  // namespace indexer::client::cli

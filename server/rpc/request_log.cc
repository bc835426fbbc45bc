#include "server/rpc/request_log.h"

#include <chrono>
#include <utility>
#include <vector>

#include "absl/strings/match.h"
#include "absl/strings/str_format.h"
#include "server/rpc/identity.h"
#include "server/rpc/log_format.h"
#include "server/rpc/log_safe.h"
#include "server/rpc/quota.h"
#include "spdlog/spdlog.h"

namespace indexer {
namespace {

using Clock = std::chrono::steady_clock;

std::string Metadata(const grpc::ServerContextBase& ctx, const char* key) {
  const auto& md = ctx.client_metadata();
  auto it = md.find(key);
  if (it == md.end()) return "";
  return LogSafe(absl::string_view(it->second.data(), it->second.size()), 128);
}

bool Quiet(absl::string_view method, const grpc::Status& status) {
  return absl::StartsWith(method, "/grpc.health.") ||
         absl::StartsWith(method, "/grpc.reflection.") ||
         status.error_code() == grpc::StatusCode::RESOURCE_EXHAUSTED;
}

const char* CodeName(grpc::StatusCode c) {
  static constexpr const char* kNames[] = {
      "OK",        "CANCELLED",          "UNKNOWN",           "INVALID_ARGUMENT",
      "DEADLINE_EXCEEDED", "NOT_FOUND",  "ALREADY_EXISTS",    "PERMISSION_DENIED",
      "RESOURCE_EXHAUSTED", "FAILED_PRECONDITION", "ABORTED", "OUT_OF_RANGE",
      "UNIMPLEMENTED", "INTERNAL",       "UNAVAILABLE",       "DATA_LOSS",
      "UNAUTHENTICATED"};
  const int i = static_cast<int>(c);
  return i >= 0 && i < 17 ? kNames[i] : "UNKNOWN";
}

class RequestLog final : public grpc::experimental::Interceptor {
 public:
  RequestLog(grpc::experimental::ServerRpcInfo* info, const std::string* client_header)
      : info_(info), client_header_(client_header), start_(Clock::now()) {}

  void Intercept(grpc::experimental::InterceptorBatchMethods* methods) override {
    if (methods->QueryInterceptionHookPoint(
            grpc::experimental::InterceptionHookPoints::PRE_SEND_STATUS)) {
      const grpc::ServerContextBase& ctx = *info_->server_context();
      const double ms =
          std::chrono::duration<double, std::milli>(Clock::now() - start_).count();
      LogCall(info_->method(), TagOf(ctx), "",
              ClientQuotas::Display(ClientIdentity(ctx, *client_header_)),
              methods->GetSendStatus(), ms);
    }
    methods->Proceed();
  }

 private:
  grpc::experimental::ServerRpcInfo* info_;
  const std::string* client_header_;
  Clock::time_point start_;
};

class RequestLogFactory final : public grpc::experimental::ServerInterceptorFactoryInterface {
 public:
  explicit RequestLogFactory(std::string client_header)
      : client_header_(std::move(client_header)) {}
  grpc::experimental::Interceptor* CreateServerInterceptor(
      grpc::experimental::ServerRpcInfo* info) override {
    // Step logs its own line; nothing per message is intercepted.
    if (absl::EndsWith(info->method(), "/Step")) return nullptr;
    return new RequestLog(info, &client_header_);
  }

 private:
  const std::string client_header_;
};

}  // namespace

CallTag TagOf(const grpc::ServerContextBase& ctx) {
  return {Metadata(ctx, "x-request-id"), Metadata(ctx, "traceparent")};
}

void LogCall(absl::string_view method, const CallTag& tag, const std::string& request_id,
             const std::string& client, const grpc::Status& status, double ms) {
  const spdlog::level::level_enum level =
      Quiet(method, status) ? spdlog::level::debug : spdlog::level::info;
  if (!spdlog::should_log(level)) return;
  const std::string& id = request_id.empty() ? tag.request_id : request_id;
  const char* code = CodeName(status.error_code());
  if (CurrentLogFormat() == LogFormat::kJson) {
    LogFields fields({{"method", std::string(method)},
                      {"request_id", id},
                      {"traceparent", tag.traceparent},
                      {"client", client},
                      {"code", code},
                      {"ms", absl::StrFormat("%.3f", ms)}});
    spdlog::log(level, "call");
    return;
  }
  spdlog::log(level, "call {} request_id={} traceparent={} client={} {} {:.3f} ms",
              std::string(method), id.empty() ? "-" : id,
              tag.traceparent.empty() ? "-" : tag.traceparent, client, code, ms);
}

std::unique_ptr<grpc::experimental::ServerInterceptorFactoryInterface> MakeRequestLogFactory(
    const std::string& client_header) {
  return std::make_unique<RequestLogFactory>(client_header);
}

}  // namespace indexer

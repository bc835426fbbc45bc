// One info line per call (an access log): method, request id, the W3C
// `traceparent` the caller sent, client, status code and duration; with
// --log-format json these are fields of the line (log_format.h). Health
// and reflection calls go to debug (probes would flood the log), and so do
// RESOURCE_EXHAUSTED refusals, which the service logs rate-limited.
//
// Unary calls are logged by a server interceptor; a Step stream logs its
// own line when it ends (LogCall), with the step's id as request id.
#pragma once

#include <memory>
#include <string>

#include "absl/strings/string_view.h"
#include "grpcpp/server_context.h"
#include "grpcpp/support/server_interceptor.h"
#include "grpcpp/support/status.h"

namespace indexer {

// What the caller's metadata says about the call: `x-request-id` and
// `traceparent`, escaped and capped for logs; empty when absent.
struct CallTag {
  std::string request_id;
  std::string traceparent;
};
CallTag TagOf(const grpc::ServerContextBase& ctx);

// Logs the call's line. `request_id` overrides the tag's when not empty.
void LogCall(absl::string_view method, const CallTag& tag, const std::string& request_id,
             const std::string& client, const grpc::Status& status, double ms);

// The interceptor for every method but Step. `client_header` as in
// identity.h.
std::unique_ptr<grpc::experimental::ServerInterceptorFactoryInterface> MakeRequestLogFactory(
    const std::string& client_header);

}  // namespace indexer

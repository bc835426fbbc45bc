#include "server/rpc/grpc_status.h"

#include <string>
#include <vector>

#include "absl/strings/ascii.h"
#include "absl/strings/match.h"
#include "absl/strings/strip.h"
#include "absl/strings/str_join.h"
#include "absl/strings/string_view.h"
#include "google/rpc/error_details.pb.h"
#include "google/rpc/status.pb.h"
#include "grpcpp/support/error_details.h"
#include "server/rpc/log_safe.h"

namespace indexer {
namespace {

// A field path: name(\[\d+\])?(\.name(\[\d+\])?)*, names of [A-Za-z0-9_].
bool IsFieldPath(absl::string_view p) {
  if (p.empty()) return false;
  bool want_name = true;
  size_t i = 0;
  while (i < p.size()) {
    if (want_name) {
      const size_t start = i;
      while (i < p.size() && (absl::ascii_isalnum(p[i]) || p[i] == '_')) ++i;
      if (i == start || absl::ascii_isdigit(p[start])) return false;
      want_name = false;
      continue;
    }
    if (p[i] == '[') {
      const size_t start = ++i;
      while (i < p.size() && absl::ascii_isdigit(p[i])) ++i;
      if (i == start || i >= p.size() || p[i] != ']') return false;
      ++i;
    } else if (p[i] == '.') {
      ++i;
      want_name = true;
    } else {
      return false;
    }
  }
  return !want_name;
}

// "layer 12": a Step layer's prefix (service.cc), the request's `layer`.
bool IsLayerPrefix(absl::string_view p) {
  if (!absl::ConsumePrefix(&p, "layer ") || p.empty()) return false;
  for (char c : p) {
    if (!absl::ascii_isdigit(c)) return false;
  }
  return true;
}

}  // namespace

std::string FieldOfMessage(const std::string& message) {
  std::vector<std::string> parts;
  absl::string_view rest = message;
  for (;;) {
    const size_t colon = rest.find(": ");
    if (colon == absl::string_view::npos) break;
    const absl::string_view head = rest.substr(0, colon);
    if (IsLayerPrefix(head)) {
      if (!parts.empty()) break;
      parts.push_back("layer");
    } else if (IsFieldPath(head)) {
      parts.push_back(std::string(head));
    } else {
      break;
    }
    rest.remove_prefix(colon + 2);
  }
  // "request: expected a StepRequest message" names the whole request, not a
  // field of it.
  if (parts.size() == 1 && parts[0] == "request") return "";
  // A bare "layer N: <prose>" names the layer id itself.
  return absl::StrJoin(parts, ".");
}

grpc::Status ToGrpcStatus(const absl::Status& s) {
  if (s.ok()) return grpc::Status::OK;
  // absl and gRPC share the canonical code numbering. Texts are capped: a
  // message that quotes a client's 1 MB shape must not become a 1 MB status.
  const std::string message = CapText(s.message());
  const auto code = static_cast<grpc::StatusCode>(s.code());
  if (s.code() != absl::StatusCode::kInvalidArgument &&
      s.code() != absl::StatusCode::kOutOfRange) {
    return grpc::Status(code, message);
  }
  const std::string field = FieldOfMessage(message);
  if (field.empty()) return grpc::Status(code, message);
  google::rpc::BadRequest bad;
  google::rpc::BadRequest::FieldViolation* v = bad.add_field_violations();
  v->set_field(field);
  v->set_description(message);
  google::rpc::Status details;
  details.set_code(static_cast<int>(s.code()));
  details.set_message(message);
  details.add_details()->PackFrom(bad);
  grpc::Status out;
  if (!grpc::SetErrorDetails(details, &out).ok()) return grpc::Status(code, message);
  return out;
}

}  // namespace indexer

// The optional gRPC authorization policy (authz_policy_file, SPEC §9).
//
// Debian's gRPC 1.51 ships the authorization filter but not the policy
// providers (grpc::experimental::*AuthorizationPolicyProvider::Create are
// in no installed library), so the policy is read here and enforced by an
// AuthMetadataProcessor on the listener's credentials, which sees every
// call's metadata and peer before the handler runs. gRPC's insecure
// credentials run no such processor, so a policy needs a TLS listener
// (server-only TLS is enough for rules on headers). The file format is
// gRPC's authorization policy JSON:
//
//   {"name": "indexer",
//    "deny_rules":  [{"name": "no-release-b",
//                     "source":  {"principals": ["client-b"]},
//                     "request": {"paths": ["/indexer.v1.Indexer/Release"]}}],
//    "allow_rules": [{"name": "all"}]}
//
// A call matching a deny rule is refused; else one matching an allow rule
// is let through; else it is refused (PERMISSION_DENIED naming the rule or
// "no allow rule"). A rule matches when each of its lists has a matching
// entry (absent lists match all): source.principals against the TLS peer's
// identities (its SANs; "*" = any authenticated peer), request.paths
// against the method ("/indexer.v1.Indexer/Step"), request.headers
// ({"key", "values"}) against the call's metadata. Patterns: exact,
// "prefix*", "*suffix" or "*". The file is re-read when it changes (checked
// at most every refresh interval); a file that no longer parses keeps the
// previous policy in force and is logged.
#pragma once

#include <memory>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"
#include "grpcpp/security/auth_metadata_processor.h"

namespace indexer {

struct AuthzRule {
  struct Header {
    std::string key;
    std::vector<std::string> values;
  };
  std::string name;
  std::vector<std::string> principals;
  std::vector<std::string> paths;
  std::vector<Header> headers;
};

struct AuthzRules {
  std::string name;
  std::vector<AuthzRule> deny;
  std::vector<AuthzRule> allow;
};

// INVALID_ARGUMENT naming the field for anything outside the format above.
absl::StatusOr<AuthzRules> ParseAuthzPolicy(const std::string& json);

struct AuthzRequest {
  std::string path;                                         // "/pkg.Service/Method"
  std::vector<std::string> principals;                      // empty: unauthenticated
  std::vector<std::pair<std::string, std::string>> headers; // lower-case keys
};

// OK, or PERMISSION_DENIED naming the deciding rule.
absl::Status Authorize(const AuthzRules& rules, const AuthzRequest& req);

class AuthzPolicy {
 public:
  static absl::StatusOr<std::shared_ptr<AuthzPolicy>> Load(const std::string& path,
                                                           uint32_t refresh_s);
  absl::Status Check(const AuthzRequest& req);

 private:
  AuthzPolicy(std::string path, absl::Duration refresh) : path_(std::move(path)), refresh_(refresh) {}
  void MaybeReload() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);

  const std::string path_;
  const absl::Duration refresh_;
  absl::Mutex mu_;
  AuthzRules rules_ ABSL_GUARDED_BY(mu_);
  std::string text_ ABSL_GUARDED_BY(mu_);
  absl::Time checked_ ABSL_GUARDED_BY(mu_);
};

std::shared_ptr<grpc::AuthMetadataProcessor> MakeAuthzProcessor(
    std::shared_ptr<AuthzPolicy> policy);

}  // namespace indexer

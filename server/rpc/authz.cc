#include "server/rpc/authz.h"

#include <fstream>
#include <sstream>

#include "absl/strings/escaping.h"
#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "google/protobuf/struct.pb.h"
#include "google/protobuf/util/json_util.h"
#include "spdlog/spdlog.h"

namespace indexer {
namespace {

using google::protobuf::Struct;
using google::protobuf::Value;

absl::StatusOr<std::vector<std::string>> Strings(const std::string& field, const Value& v) {
  if (!v.has_list_value()) {
    return absl::InvalidArgumentError(absl::StrCat(field, ": expected a list of strings"));
  }
  std::vector<std::string> out;
  for (int i = 0; i < v.list_value().values_size(); ++i) {
    const Value& e = v.list_value().values(i);
    if (!e.has_string_value()) {
      return absl::InvalidArgumentError(absl::StrCat(field, "[", i, "]: expected a string"));
    }
    out.push_back(e.string_value());
  }
  return out;
}

absl::Status OnlyKeys(const std::string& field, const Struct& s,
                      std::initializer_list<const char*> keys) {
  for (const auto& [k, v] : s.fields()) {
    bool known = false;
    for (const char* key : keys) known = known || k == key;
    if (!known) {
      std::string list;
      for (const char* key : keys) absl::StrAppend(&list, list.empty() ? "" : ", ", key);
      return absl::InvalidArgumentError(
          absl::StrCat(field, ": expected only {", list, "}, got '", k, "'"));
    }
  }
  return absl::OkStatus();
}

absl::StatusOr<AuthzRule> ParseRule(const std::string& field, const Value& v) {
  if (!v.has_struct_value()) {
    return absl::InvalidArgumentError(absl::StrCat(field, ": expected an object"));
  }
  const Struct& s = v.struct_value();
  if (auto st = OnlyKeys(field, s, {"name", "source", "request"}); !st.ok()) return st;
  AuthzRule rule;
  auto name = s.fields().find("name");
  if (name == s.fields().end() || !name->second.has_string_value() ||
      name->second.string_value().empty()) {
    return absl::InvalidArgumentError(absl::StrCat(field, ".name: expected a non-empty string"));
  }
  rule.name = name->second.string_value();
  if (auto src = s.fields().find("source"); src != s.fields().end()) {
    const std::string f = absl::StrCat(field, ".source");
    if (!src->second.has_struct_value()) {
      return absl::InvalidArgumentError(absl::StrCat(f, ": expected an object"));
    }
    const Struct& so = src->second.struct_value();
    if (auto st = OnlyKeys(f, so, {"principals"}); !st.ok()) return st;
    if (auto p = so.fields().find("principals"); p != so.fields().end()) {
      auto list = Strings(f + ".principals", p->second);
      if (!list.ok()) return list.status();
      rule.principals = *std::move(list);
    }
  }
  if (auto req = s.fields().find("request"); req != s.fields().end()) {
    const std::string f = absl::StrCat(field, ".request");
    if (!req->second.has_struct_value()) {
      return absl::InvalidArgumentError(absl::StrCat(f, ": expected an object"));
    }
    const Struct& ro = req->second.struct_value();
    if (auto st = OnlyKeys(f, ro, {"paths", "headers"}); !st.ok()) return st;
    if (auto p = ro.fields().find("paths"); p != ro.fields().end()) {
      auto list = Strings(f + ".paths", p->second);
      if (!list.ok()) return list.status();
      rule.paths = *std::move(list);
    }
    if (auto h = ro.fields().find("headers"); h != ro.fields().end()) {
      if (!h->second.has_list_value()) {
        return absl::InvalidArgumentError(absl::StrCat(f, ".headers: expected a list"));
      }
      for (int i = 0; i < h->second.list_value().values_size(); ++i) {
        const std::string hf = absl::StrCat(f, ".headers[", i, "]");
        const Value& hv = h->second.list_value().values(i);
        if (!hv.has_struct_value()) {
          return absl::InvalidArgumentError(absl::StrCat(hf, ": expected an object"));
        }
        const Struct& ho = hv.struct_value();
        if (auto st = OnlyKeys(hf, ho, {"key", "values"}); !st.ok()) return st;
        auto key = ho.fields().find("key");
        auto values = ho.fields().find("values");
        if (key == ho.fields().end() || !key->second.has_string_value() ||
            key->second.string_value().empty() || values == ho.fields().end()) {
          return absl::InvalidArgumentError(
              absl::StrCat(hf, ": expected a non-empty key and a values list"));
        }
        AuthzRule::Header header;
        header.key = key->second.string_value();
        for (char& c : header.key) c = static_cast<char>(std::tolower(static_cast<unsigned char>(c)));
        auto list = Strings(hf + ".values", values->second);
        if (!list.ok()) return list.status();
        header.values = *std::move(list);
        rule.headers.push_back(std::move(header));
      }
    }
  }
  return rule;
}

absl::StatusOr<std::vector<AuthzRule>> ParseRules(const Struct& policy, const char* key,
                                                  bool required) {
  auto it = policy.fields().find(key);
  if (it == policy.fields().end()) {
    if (required) return absl::InvalidArgumentError(absl::StrCat(key, ": expected a list of rules"));
    return std::vector<AuthzRule>{};
  }
  if (!it->second.has_list_value()) {
    return absl::InvalidArgumentError(absl::StrCat(key, ": expected a list of rules"));
  }
  std::vector<AuthzRule> rules;
  for (int i = 0; i < it->second.list_value().values_size(); ++i) {
    auto rule = ParseRule(absl::StrCat(key, "[", i, "]"), it->second.list_value().values(i));
    if (!rule.ok()) return rule.status();
    rules.push_back(*std::move(rule));
  }
  return rules;
}

bool MatchPattern(const std::string& pattern, const std::string& s) {
  if (pattern == "*") return true;
  if (pattern.size() > 1 && pattern.back() == '*') {
    return absl::StartsWith(s, pattern.substr(0, pattern.size() - 1));
  }
  if (pattern.size() > 1 && pattern.front() == '*') {
    return absl::EndsWith(s, pattern.substr(1));
  }
  return pattern == s;
}

bool Matches(const AuthzRule& rule, const AuthzRequest& req) {
  if (!rule.principals.empty()) {
    bool any = false;
    for (const std::string& p : rule.principals) {
      for (const std::string& id : req.principals) any = any || MatchPattern(p, id);
    }
    if (!any) return false;
  }
  if (!rule.paths.empty()) {
    bool any = false;
    for (const std::string& p : rule.paths) any = any || MatchPattern(p, req.path);
    if (!any) return false;
  }
  for (const AuthzRule::Header& h : rule.headers) {
    bool any = false;
    for (const auto& [k, v] : req.headers) {
      if (k != h.key) continue;
      for (const std::string& p : h.values) any = any || MatchPattern(p, v);
    }
    if (!any) return false;
  }
  return true;
}

absl::StatusOr<std::string> ReadFile(const std::string& path) {
  std::ifstream f(path, std::ios::binary);
  if (!f) {
    return absl::InvalidArgumentError(
        absl::StrCat("authz_policy_file: expected a readable file, got '", path, "'"));
  }
  std::ostringstream ss;
  ss << f.rdbuf();
  return ss.str();
}

}  // namespace

absl::StatusOr<AuthzRules> ParseAuthzPolicy(const std::string& json) {
  Struct policy;
  if (!google::protobuf::util::JsonStringToMessage(json, &policy).ok()) {
    return absl::InvalidArgumentError("authz policy: expected a JSON object");
  }
  if (auto st = OnlyKeys("authz policy", policy, {"name", "deny_rules", "allow_rules"}); !st.ok()) {
    return st;
  }
  AuthzRules rules;
  auto name = policy.fields().find("name");
  if (name == policy.fields().end() || !name->second.has_string_value() ||
      name->second.string_value().empty()) {
    return absl::InvalidArgumentError("name: expected a non-empty string");
  }
  rules.name = name->second.string_value();
  auto deny = ParseRules(policy, "deny_rules", false);
  if (!deny.ok()) return deny.status();
  rules.deny = *std::move(deny);
  auto allow = ParseRules(policy, "allow_rules", true);
  if (!allow.ok()) return allow.status();
  rules.allow = *std::move(allow);
  return rules;
}

absl::Status Authorize(const AuthzRules& rules, const AuthzRequest& req) {
  for (const AuthzRule& r : rules.deny) {
    if (Matches(r, req)) {
      return absl::PermissionDeniedError(
          absl::StrCat("authz policy '", rules.name, "': ", absl::CEscape(req.path), " denied by rule '",
                       r.name, "'"));
    }
  }
  for (const AuthzRule& r : rules.allow) {
    if (Matches(r, req)) return absl::OkStatus();
  }
  return absl::PermissionDeniedError(
      absl::StrCat("authz policy '", rules.name, "': ", absl::CEscape(req.path), " matches no allow rule"));
}

absl::StatusOr<std::shared_ptr<AuthzPolicy>> AuthzPolicy::Load(const std::string& path,
                                                               uint32_t refresh_s) {
  auto text = ReadFile(path);
  if (!text.ok()) return text.status();
  auto rules = ParseAuthzPolicy(*text);
  if (!rules.ok()) {
    return absl::InvalidArgumentError(
        absl::StrCat("authz_policy_file '", path, "': ", rules.status().message()));
  }
  std::shared_ptr<AuthzPolicy> policy(new AuthzPolicy(path, absl::Seconds(refresh_s)));
  absl::MutexLock lock(&policy->mu_);
  policy->rules_ = *std::move(rules);
  policy->text_ = *std::move(text);
  policy->checked_ = absl::Now();
  return policy;
}

void AuthzPolicy::MaybeReload() {
  const absl::Time now = absl::Now();
  if (now - checked_ < refresh_) return;
  checked_ = now;
  auto text = ReadFile(path_);
  if (!text.ok() || *text == text_) return;
  text_ = *text;  // a bad file is reported once, not on every call
  auto rules = ParseAuthzPolicy(*text);
  if (!rules.ok()) {
    spdlog::warn("authz_policy_file '{}' changed but does not parse ({}); keeping the previous "
                 "policy",
                 path_, std::string(rules.status().message()));
    return;
  }
  rules_ = *std::move(rules);
  spdlog::info("authz_policy_file '{}' reloaded: policy '{}'", path_, rules_.name);
}

absl::Status AuthzPolicy::Check(const AuthzRequest& req) {
  absl::MutexLock lock(&mu_);
  MaybeReload();
  return Authorize(rules_, req);
}

namespace {

class AuthzProcessor final : public grpc::AuthMetadataProcessor {
 public:
  explicit AuthzProcessor(std::shared_ptr<AuthzPolicy> policy) : policy_(std::move(policy)) {}

  // The check is a few string compares: run it inline, not on gRPC's
  // blocking-processor thread.
  bool IsBlocking() const override { return false; }

  grpc::Status Process(const InputMetadata& md, grpc::AuthContext* ctx, OutputMetadata*,
                       OutputMetadata*) override {
    AuthzRequest req;
    for (const auto& [k, v] : md) {
      std::string key(k.data(), k.size());
      if (key == ":path") req.path.assign(v.data(), v.size());
      req.headers.emplace_back(std::move(key), std::string(v.data(), v.size()));
    }
    if (ctx != nullptr && ctx->IsPeerAuthenticated()) {
      for (const grpc::string_ref& id : ctx->GetPeerIdentity()) {
        req.principals.emplace_back(id.data(), id.size());
      }
    }
    absl::Status s = policy_->Check(req);
    if (s.ok()) return grpc::Status::OK;
    spdlog::info("{}", std::string(s.message()));
    return grpc::Status(grpc::StatusCode::PERMISSION_DENIED, std::string(s.message()));
  }

 private:
  std::shared_ptr<AuthzPolicy> policy_;
};

}  // namespace

std::shared_ptr<grpc::AuthMetadataProcessor> MakeAuthzProcessor(
    std::shared_ptr<AuthzPolicy> policy) {
  return std::make_shared<AuthzProcessor>(std::move(policy));
}

}  // namespace indexer

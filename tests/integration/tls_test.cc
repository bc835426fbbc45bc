// TLS, mutual TLS, certificate rotation, client identity and the
// authorization policy (SPEC §6 "Clients and tenancy", §9), end to end on
// the cpu backend. The certificates are made at test time by
// make_test_certs.sh (openssl) in a fresh temporary directory.
#include <unistd.h>

#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <optional>
#include <thread>

#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "indexer/client.h"
#include "server/rpc/authz.h"
#include "server/rpc/credentials.h"
#include "server/rpc/server.h"
#include "tests/integration/test_config.h"
#include "tests/integration/wire_harness.h"

#ifndef INDEXER_CERT_SCRIPT
#error "INDEXER_CERT_SCRIPT: path of make_test_certs.sh"
#endif

namespace indexer::testing {
namespace {

namespace fs = std::filesystem;
using ::testing::AllOf;
using ::testing::HasSubstr;
using ::testing::Not;

bool pki_made = false;

// The test PKI, generated once for the whole suite.
const fs::path& Pki() {
  static const fs::path dir = [] {
    pki_made = true;
    std::string tmpl = (fs::temp_directory_path() / "indexer-tls-XXXXXX").string();
    const char* made = mkdtemp(tmpl.data());
    EXPECT_NE(made, nullptr);
    const std::string cmd = std::string(INDEXER_CERT_SCRIPT) + " " + tmpl;
    EXPECT_EQ(std::system(cmd.c_str()), 0) << cmd;
    return fs::path(tmpl);
  }();
  return dir;
}
// Removes the PKI once every test ran.
class PkiCleanup : public ::testing::Environment {
 public:
  void TearDown() override {
    std::error_code ignored;
    if (pki_made) fs::remove_all(Pki(), ignored);
  }
};
[[maybe_unused]] ::testing::Environment* const kPkiCleanup =
    ::testing::AddGlobalTestEnvironment(new PkiCleanup);

std::string Pem(const std::string& name) { return (Pki() / (name + ".pem")).string(); }
std::string Key(const std::string& name) { return (Pki() / (name + ".key")).string(); }

// A daemon on 127.0.0.1:0 with `cfg`'s listener security.
class SecureDaemon {
 public:
  explicit SecureDaemon(const config::ServerConfig& cfg)
      : server_(StartTestServer(cfg, &layers_)) {}
  Engine& engine() { return server_->engine(); }
  const std::vector<TestLayer>& layers() const { return layers_; }
  std::string address() const { return "127.0.0.1:" + std::to_string(server_->port()); }

 private:
  std::vector<TestLayer> layers_;
  std::unique_ptr<RunningServer> server_;
};

config::ServerConfig BaseConfig() {
  return MakeConfig({{.format = "fp8", .num_layers = 2, .pages = 64}});
}

config::ServerConfig MutualTlsConfig() {
  config::ServerConfig cfg = BaseConfig();
  cfg.mutable_tls()->set_cert_file(Pem("server"));
  cfg.mutable_tls()->set_key_file(Key("server"));
  cfg.mutable_tls()->set_ca_file(Pem("ca"));
  return cfg;
}

client::TlsOptions ClientTls(const std::string& ca, const std::string& who = "") {
  client::TlsOptions t;
  t.ca_file = Pem(ca);
  if (!who.empty()) {
    t.cert_file = Pem(who);
    t.key_file = Key(who);
  }
  return t;
}

absl::StatusOr<std::unique_ptr<IndexerClient>> Connect(
    const std::string& address, std::optional<client::TlsOptions> tls,
    const std::string& client_id = "", absl::Duration timeout = absl::Seconds(5)) {
  client::ClientOptions o;
  o.tls = std::move(tls);
  o.client_id = client_id;
  o.connect_timeout = timeout;
  return IndexerClient::Connect(address, o);
}

std::unique_ptr<IndexerClient> MustConnect(const std::string& address,
                                           std::optional<client::TlsOptions> tls,
                                           const std::string& client_id = "") {
  auto c = Connect(address, std::move(tls), client_id);
  EXPECT_TRUE(c.ok()) << c.status();
  return c.ok() ? *std::move(c) : nullptr;
}

// True when the connection attempt or the first call fails: under TLS 1.3
// a client finishes its handshake before the server has judged its
// certificate, so a refused client may see the refusal only on its first call.
bool Refused(absl::StatusOr<std::unique_ptr<IndexerClient>> c) {
  if (!c.ok()) return true;
  return !(*c)->GetServerInfo().ok();
}

// One committed step of `seqs` through `c`, every layer's top-k checked
// against `shadow` (WireStep for a client of its own).
void StepAndCheck(IndexerClient& c, const std::vector<TestLayer>& layers, Shadow& shadow,
                  const std::vector<SeqStep>& seqs) {
  auto step = c.OpenStep(Header(seqs, shadow));
  ASSERT_TRUE(step.ok()) << step.status();
  std::vector<LayerData> data = shadow.Make(seqs);
  for (size_t li = 0; li < layers.size(); ++li) {
    auto reply = (*step)->RunLayer(Request(layers[li], data[li], Form::kFloat));
    ASSERT_TRUE(reply.ok()) << reply.status();
    auto topk = client::ReadInt32Tensor(reply->topk(), {data[li].rows, layers[li].topk}, "topk");
    ASSERT_TRUE(topk.ok()) << topk.status();
    shadow.Check(li, seqs, data[li], topk->data());
  }
  auto committed = (*step)->Commit();
  ASSERT_TRUE(committed.ok()) << committed.status();
  shadow.Commit(seqs, data);
  ASSERT_EQ(committed->seq_lens_size(), static_cast<int>(seqs.size()));
  for (size_t i = 0; i < seqs.size(); ++i) {
    EXPECT_EQ(committed->seq_lens(i), static_cast<uint64_t>(shadow.len(seqs[i].first)));
  }
}

// A step that extends `name` without creating it: the status of its first layer.
absl::Status ExtendWithoutCreate(IndexerClient& c, const std::vector<TestLayer>& layers,
                                 const std::string& name) {
  Shadow scratch(layers, 5);
  v1::StepHeader h;
  v1::StepSequence* s = h.add_sequences();
  *s->mutable_id() = client::NamedSequenceId(name);
  s->set_q_len(1);
  s->set_create(false);
  auto step = c.OpenStep(h);
  if (!step.ok()) return step.status();
  std::vector<LayerData> data = scratch.Make({{name, 1}});
  return (*step)->RunLayer(Request(layers[0], data[0], Form::kFloat)).status();
}

v1::WriteEntriesRequest ImportInto(const std::vector<TestLayer>& layers, const std::string& name,
                                   bool create, int64_t n) {
  Shadow scratch(layers, 6);
  std::vector<LayerData> data = scratch.Make({{name, n}});
  v1::WriteEntriesRequest w;
  *w.mutable_id() = client::NamedSequenceId(name);
  w.set_create(create);
  w.set_num_tokens(static_cast<uint64_t>(n));
  for (size_t li = 0; li < layers.size(); ++li) {
    v1::LayerEntries* le = w.add_layers();
    le->set_layer(layers[li].layer);
    *le->mutable_k() = client::MakeByteTensor(v1::UINT8, data[li].k_quant,
                                              {data[li].n_new, layers[li].layout.entry_bytes()});
  }
  return w;
}

// A owns "s"; B can neither see, extend, import into nor release it, and
// makes an "s" of its own that lives beside A's. Both identities are
// whatever `a` and `b` present (certificates or headers).
void CheckIsolation(SecureDaemon& d, IndexerClient& a, IndexerClient& b, const std::string& a_id) {
  Shadow sa(d.layers(), 11), sb(d.layers(), 12);
  StepAndCheck(a, d.layers(), sa, {{"s", 40}});
  StepAndCheck(a, d.layers(), sa, {{"s", 1}});
  ASSERT_EQ(d.engine().num_sequences(), 1);

  const absl::Status extend = ExtendWithoutCreate(b, d.layers(), "s");
  EXPECT_EQ(extend.code(), absl::StatusCode::kNotFound) << extend;
  // The display name, never the namespaced key (nor A's identity).
  EXPECT_THAT(std::string(extend.message()),
              AllOf(HasSubstr("\"s\""), Not(HasSubstr(a_id)), Not(HasSubstr("tls:")),
                    Not(HasSubstr("hdr:"))));
  const auto released = b.Release({client::NamedSequenceId("s")});
  EXPECT_EQ(released.status().code(), absl::StatusCode::kNotFound) << released.status();
  EXPECT_THAT(std::string(released.status().message()), Not(HasSubstr(a_id)));
  const auto imported = b.WriteEntries(ImportInto(d.layers(), "s", /*create=*/false, 3));
  EXPECT_EQ(imported.status().code(), absl::StatusCode::kNotFound) << imported.status();
  EXPECT_EQ(d.engine().num_sequences(), 1);

  // B's own "s": created independently, in its namespace.
  StepAndCheck(b, d.layers(), sb, {{"s", 7}});
  EXPECT_EQ(d.engine().num_sequences(), 2);
  // A's sequence is untouched by all of the above: its next step still
  // matches A's shadow (40 + 1 tokens, not B's 7).
  StepAndCheck(a, d.layers(), sa, {{"s", 2}});
  EXPECT_EQ(sa.len("s"), 43);
  EXPECT_EQ(sb.len("s"), 7);
  // Importing into B's "s" extends B's only.
  auto len = b.WriteEntries(ImportInto(d.layers(), "s", /*create=*/false, 3));
  ASSERT_TRUE(len.ok()) << len.status();
  EXPECT_EQ(*len, 10u);

  // Each releases its own; the other's stays.
  ASSERT_TRUE(b.Release({client::NamedSequenceId("s")}).ok());
  EXPECT_EQ(d.engine().num_sequences(), 1);
  StepAndCheck(a, d.layers(), sa, {{"s", 1}});
  ASSERT_TRUE(a.Release({client::NamedSequenceId("s")}).ok());
  EXPECT_EQ(d.engine().num_sequences(), 0);
  ASSERT_TRUE(d.engine().CheckInvariants().ok()) << d.engine().CheckInvariants();
}

TEST(MutualTls, CertificateIdentityNamespacesSequences) {
  SecureDaemon d(MutualTlsConfig());
  auto a = MustConnect(d.address(), ClientTls("ca", "client-a"));
  auto b = MustConnect(d.address(), ClientTls("ca", "client-b"));
  ASSERT_TRUE(a && b);
  CheckIsolation(d, *a, *b, "client-a");
}

// Under mutual TLS the certificate names the client: a header claiming to
// be another client changes nothing.
TEST(MutualTls, HeaderCannotImpersonate) {
  SecureDaemon d(MutualTlsConfig());
  auto a = MustConnect(d.address(), ClientTls("ca", "client-a"));
  auto b = MustConnect(d.address(), ClientTls("ca", "client-b"), /*client_id=*/"client-a");
  ASSERT_TRUE(a && b);
  CheckIsolation(d, *a, *b, "client-a");
}

TEST(MutualTls, RefusesPlaintextUncertifiedAndUntrustedClients) {
  SecureDaemon d(MutualTlsConfig());
  const absl::Duration t = absl::Seconds(2);
  EXPECT_TRUE(Refused(Connect(d.address(), std::nullopt, "", t))) << "plaintext";
  EXPECT_TRUE(Refused(Connect(d.address(), ClientTls("ca"), "", t))) << "no client certificate";
  EXPECT_TRUE(Refused(Connect(d.address(), ClientTls("ca", "client-x"), "", t)))
      << "client certificate of another CA";
  // A client that does not trust the server's CA refuses it.
  EXPECT_TRUE(Refused(Connect(d.address(), ClientTls("ca2", "client-a"), "", t)));
  // And the certified one gets through, also naming the server explicitly.
  client::TlsOptions named = ClientTls("ca", "client-a");
  named.server_name = "localhost";
  auto ok = Connect(d.address(), named);
  ASSERT_TRUE(ok.ok()) << ok.status();
  EXPECT_TRUE((*ok)->GetServerInfo().ok());
}

TEST(Tls, ServerOnlyTlsRefusesPlaintext) {
  config::ServerConfig cfg = MutualTlsConfig();
  cfg.mutable_tls()->clear_ca_file();
  SecureDaemon d(cfg);
  EXPECT_TRUE(Refused(Connect(d.address(), std::nullopt, "", absl::Seconds(2))));
  // No client certificate needed; the header names the client.
  auto a = MustConnect(d.address(), ClientTls("ca"), "tenant-a");
  auto b = MustConnect(d.address(), ClientTls("ca"), "tenant-b");
  ASSERT_TRUE(a && b);
  CheckIsolation(d, *a, *b, "tenant-a");
}

void CopyAtomically(const std::string& from, const std::string& to) {
  const std::string tmp = to + ".tmp";
  fs::copy_file(from, tmp, fs::copy_options::overwrite_existing);
  fs::rename(tmp, to);
}

// The served certificate changes on disk; after the refresh interval (1 s)
// new connections get the new one, with no restart.
TEST(Tls, RotatesServerCertificateWithoutRestart) {
  const fs::path dir = Pki() / "rotation";
  fs::create_directories(dir);
  const std::string cert = (dir / "server.pem").string(), key = (dir / "server.key").string();
  fs::copy_file(Pem("server"), cert, fs::copy_options::overwrite_existing);
  fs::copy_file(Key("server"), key, fs::copy_options::overwrite_existing);
  config::ServerConfig cfg = BaseConfig();
  cfg.mutable_tls()->set_cert_file(cert);
  cfg.mutable_tls()->set_key_file(key);
  cfg.mutable_tls()->set_refresh_s(1);
  SecureDaemon d(cfg);

  auto old_ca = MustConnect(d.address(), ClientTls("ca"));
  ASSERT_TRUE(old_ca);
  EXPECT_TRUE(Refused(Connect(d.address(), ClientTls("ca2"), "", absl::Seconds(2))))
      << "before rotation: the server's certificate is from ca";

  // A refresh between the two renames may read a mismatched pair; the next
  // one reads the new pair, which the poll below waits for.
  CopyAtomically(Key("server2"), key);
  CopyAtomically(Pem("server2"), cert);
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(20);
  bool rotated = false;
  while (!rotated && std::chrono::steady_clock::now() < deadline) {
    rotated = !Refused(Connect(d.address(), ClientTls("ca2"), "", absl::Seconds(1)));
  }
  EXPECT_TRUE(rotated) << "no new connection saw the ca2 certificate within 20 s";
  // New connections that trust only the old CA are now refused.
  EXPECT_TRUE(Refused(Connect(d.address(), ClientTls("ca"), "", absl::Seconds(2))));
}

TEST(Plaintext, HeaderIdentityNamespacesSequences) {
  SecureDaemon d(BaseConfig());
  auto a = MustConnect(d.address(), std::nullopt, "tenant-a");
  auto b = MustConnect(d.address(), std::nullopt, "tenant-b");
  ASSERT_TRUE(a && b);
  CheckIsolation(d, *a, *b, "tenant-a");
  // The anonymous client (no header) is a namespace of its own too.
  auto anon = MustConnect(d.address(), std::nullopt);
  ASSERT_TRUE(anon);
  CheckIsolation(d, *a, *anon, "tenant-a");
}

TEST(Plaintext, ConfiguredHeaderName) {
  config::ServerConfig cfg = BaseConfig();
  cfg.set_client_id_header("X-Tenant");
  SecureDaemon d(cfg);
  client::ClientOptions o;
  o.client_id_header = "x-tenant";
  o.client_id = "tenant-one";
  auto a = IndexerClient::Connect(d.address(), o);
  o.client_id = "tenant-two";
  auto b = IndexerClient::Connect(d.address(), o);
  ASSERT_TRUE(a.ok() && b.ok());
  CheckIsolation(d, **a, **b, "tenant-one");
  // Keys and values gRPC would refuse at the first call are refused at Connect.
  o.client_id_header = "X-Tenant";
  auto upper = IndexerClient::Connect(d.address(), o);
  EXPECT_THAT(std::string(upper.status().message()), HasSubstr("client_id_header: expected"));
  o.client_id_header = "x-tenant";
  o.client_id = "forged\nline";
  auto newline = IndexerClient::Connect(d.address(), o);
  EXPECT_THAT(std::string(newline.status().message()),
              HasSubstr("client_id: expected printable ASCII, got 'forged\\nline'"));
}

std::string WriteFile(const std::string& name, const std::string& text) {
  const std::string path = (Pki() / name).string();
  std::ofstream(path) << text;
  return path;
}

constexpr char kDenyReleaseToB[] = R"({
  "name": "indexer-test",
  "deny_rules": [{"name": "no-release-for-b",
                  "source": {"principals": ["client-b"]},
                  "request": {"paths": ["/indexer.v1.Indexer/Release"]}}],
  "allow_rules": [{"name": "any-certified-client", "source": {"principals": ["*"]}}]
})";

TEST(Authz, PolicyDeniesReleaseToOnePrincipal) {
  config::ServerConfig cfg = MutualTlsConfig();
  cfg.set_authz_policy_file(WriteFile("deny-release-b.json", kDenyReleaseToB));
  SecureDaemon d(cfg);
  auto a = MustConnect(d.address(), ClientTls("ca", "client-a"));
  auto b = MustConnect(d.address(), ClientTls("ca", "client-b"));
  ASSERT_TRUE(a && b);
  Shadow sa(d.layers(), 21), sb(d.layers(), 22);
  StepAndCheck(*a, d.layers(), sa, {{"s", 9}});
  StepAndCheck(*b, d.layers(), sb, {{"s", 9}});  // B may step
  const auto denied = b->Release({client::NamedSequenceId("s")});
  EXPECT_EQ(denied.status().code(), absl::StatusCode::kPermissionDenied) << denied.status();
  EXPECT_THAT(std::string(denied.status().message()), HasSubstr("no-release-for-b"));
  EXPECT_EQ(d.engine().num_sequences(), 2);
  StepAndCheck(*b, d.layers(), sb, {{"s", 1}});  // B's "s" is still there
  EXPECT_TRUE(a->Release({client::NamedSequenceId("s")}).ok());
  EXPECT_EQ(d.engine().num_sequences(), 1);
}

// A changed policy file takes effect without a restart; one that no longer
// parses leaves the last good policy in force.
TEST(Authz, PolicyFileReloads) {
  config::ServerConfig cfg = MutualTlsConfig();
  cfg.mutable_tls()->set_refresh_s(1);
  const std::string path = WriteFile("reloaded.json", kDenyReleaseToB);
  cfg.set_authz_policy_file(path);
  SecureDaemon d(cfg);
  auto b = MustConnect(d.address(), ClientTls("ca", "client-b"));
  ASSERT_TRUE(b);
  auto release_code = [&] { return b->Release({client::NamedSequenceId("s")}).status().code(); };
  ASSERT_EQ(release_code(), absl::StatusCode::kPermissionDenied);
  // Allow everything; B's Release then gets past the policy (NOT_FOUND).
  WriteFile("reloaded.json.tmp", R"({"name": "open", "allow_rules": [{"name": "all"}]})");
  fs::rename(path + ".tmp", path);
  auto wait_for = [&](absl::StatusCode want) {
    const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(20);
    while (release_code() != want && std::chrono::steady_clock::now() < deadline) {
      std::this_thread::sleep_for(std::chrono::milliseconds(50));
    }
    return release_code() == want;
  };
  EXPECT_TRUE(wait_for(absl::StatusCode::kNotFound)) << "the new policy was not picked up";
}

// Refresh 0: the file is looked at on every check, so no waiting here.
TEST(Authz, BrokenPolicyFileKeepsTheLastGoodPolicy) {
  const std::string path = WriteFile("kept.json", kDenyReleaseToB);
  auto policy = AuthzPolicy::Load(path, /*refresh_s=*/0);
  ASSERT_TRUE(policy.ok()) << policy.status();
  const AuthzRequest release_by_b{"/indexer.v1.Indexer/Release", {"client-b"}, {}};
  EXPECT_EQ((*policy)->Check(release_by_b).code(), absl::StatusCode::kPermissionDenied);
  WriteFile("kept.json", "{not json");
  EXPECT_EQ((*policy)->Check(release_by_b).code(), absl::StatusCode::kPermissionDenied);
  WriteFile("kept.json", R"({"name": "open", "allow_rules": [{"name": "all"}]})");
  EXPECT_TRUE((*policy)->Check(release_by_b).ok());
  fs::remove(path);  // unreadable: the last good policy stays too
  EXPECT_TRUE((*policy)->Check(release_by_b).ok());
}

// Without a rule that allows it, a call is refused; health and info alike.
TEST(Authz, NoMatchingAllowRuleIsDenied) {
  config::ServerConfig cfg = MutualTlsConfig();
  cfg.set_authz_policy_file(WriteFile("only-a.json", R"({
    "name": "only-a",
    "allow_rules": [{"name": "a", "source": {"principals": ["client-a"]}}]})"));
  SecureDaemon d(cfg);
  auto a = MustConnect(d.address(), ClientTls("ca", "client-a"));
  auto b = MustConnect(d.address(), ClientTls("ca", "client-b"));
  ASSERT_TRUE(a && b);
  EXPECT_TRUE(a->GetServerInfo().ok());
  const auto info = b->GetServerInfo();
  EXPECT_EQ(info.status().code(), absl::StatusCode::kPermissionDenied) << info.status();
  EXPECT_THAT(std::string(info.status().message()), HasSubstr("no allow rule"));
}

// Under server-only TLS the header names the client, and rules on headers
// apply to it.
TEST(Authz, ServerOnlyTlsPolicyMatchesHeaders) {
  config::ServerConfig cfg = MutualTlsConfig();
  cfg.mutable_tls()->clear_ca_file();
  cfg.set_authz_policy_file(WriteFile("deny-release-header.json", R"({
    "name": "plain",
    "deny_rules": [{"name": "no-release-for-b",
                    "request": {"paths": ["*/Release"],
                                "headers": [{"key": "x-indexer-client", "values": ["tenant-b"]}]}}],
    "allow_rules": [{"name": "all"}]})"));
  SecureDaemon d(cfg);
  auto a = MustConnect(d.address(), ClientTls("ca"), "tenant-a");
  auto b = MustConnect(d.address(), ClientTls("ca"), "tenant-b");
  ASSERT_TRUE(a && b);
  Shadow sb(d.layers(), 23);
  StepAndCheck(*b, d.layers(), sb, {{"s", 3}});
  EXPECT_EQ(b->Release({client::NamedSequenceId("s")}).status().code(),
            absl::StatusCode::kPermissionDenied);
  EXPECT_EQ(a->Release({client::NamedSequenceId("s")}).status().code(),
            absl::StatusCode::kNotFound);
  EXPECT_EQ(d.engine().num_sequences(), 1);
}

TEST(Authz, ParseAndMatch) {
  auto rules = ParseAuthzPolicy(R"({"name": "p",
      "deny_rules": [{"name": "d", "request": {"paths": ["*/Release"],
                      "headers": [{"key": "X-Tag", "values": ["bad*"]}]}}],
      "allow_rules": [{"name": "a", "request": {"paths": ["/indexer.v1.Indexer/*"]}}]})");
  ASSERT_TRUE(rules.ok()) << rules.status();
  AuthzRequest r{"/indexer.v1.Indexer/Release", {}, {{"x-tag", "badly"}}};
  EXPECT_EQ(Authorize(*rules, r).code(), absl::StatusCode::kPermissionDenied);
  r.headers = {{"x-tag", "good"}};
  EXPECT_TRUE(Authorize(*rules, r).ok());
  r.path = "/grpc.health.v1.Health/Check";
  EXPECT_EQ(Authorize(*rules, r).code(), absl::StatusCode::kPermissionDenied);

  EXPECT_THAT(std::string(ParseAuthzPolicy("{").status().message()), HasSubstr("JSON"));
  EXPECT_THAT(std::string(ParseAuthzPolicy(R"({"name": "p"})").status().message()),
              HasSubstr("allow_rules"));
  EXPECT_THAT(std::string(ParseAuthzPolicy(R"({"name": "p", "allow_rules": [{"name": "a",
                "source": {"namespaces": ["x"]}}]})").status().message()),
              HasSubstr("allow_rules[0].source: expected only {principals}, got 'namespaces'"));
}

// Namespaces cannot run into each other's names: "a" + name "b#1" and
// "a$b" + number 1 (or "a" + "x" and "" + "ax") are different sequences.
TEST(Namespaces, KeysDoNotCollide) {
  EXPECT_NE(SeqName::Named("b#1", "a").key, SeqName::Numeric(1, "a$b").key);
  EXPECT_NE(SeqName::Named("x", "a").key, SeqName::Named("ax", "").key);
  EXPECT_NE(SeqName::Numeric(7, "hdr:t").key, SeqName::Numeric(7, "tls:t").key);
  EXPECT_EQ(SeqName::Named("s", "tls:client-a").display, "\"s\"");
}

TEST(ListenerSecurityConfig, RefusesIncompleteOrUnreadableFiles) {
  config::ServerConfig cfg = BaseConfig();
  cfg.mutable_tls()->set_key_file(Key("server"));
  EXPECT_THAT(std::string(MakeListenerSecurity(cfg).status().message()),
              HasSubstr("cert_file and key_file together"));
  cfg = BaseConfig();
  cfg.mutable_tls()->set_ca_file(Pem("ca"));
  EXPECT_THAT(std::string(MakeListenerSecurity(cfg).status().message()), HasSubstr("tls.ca_file"));
  cfg = MutualTlsConfig();
  cfg.mutable_tls()->set_cert_file((Pki() / "missing.pem").string());
  EXPECT_THAT(std::string(MakeListenerSecurity(cfg).status().message()),
              HasSubstr("tls.cert_file: expected a readable PEM file"));
  cfg = MutualTlsConfig();
  cfg.mutable_tls()->set_key_file((Pki() / "server.ext").string());
  EXPECT_THAT(std::string(MakeListenerSecurity(cfg).status().message()),
              HasSubstr("tls.key_file: expected PEM"));
  cfg = MutualTlsConfig();
  cfg.set_authz_policy_file(WriteFile("bad.json", R"({"name": "x"})"));
  EXPECT_THAT(std::string(MakeListenerSecurity(cfg).status().message()),
              HasSubstr("allow_rules"));
  // The header's key is checked with the rest of the config.
  cfg = BaseConfig();
  cfg.set_client_id_header("x tenant");
  EXPECT_THAT(std::string(BuildModel(cfg).status().message()),
              HasSubstr("client_id_header: expected a metadata key"));
  // Plaintext listeners cannot enforce a policy: refused, not ignored.
  cfg = BaseConfig();
  cfg.set_authz_policy_file(WriteFile("ok.json", kDenyReleaseToB));
  EXPECT_THAT(std::string(MakeListenerSecurity(cfg).status().message()),
              HasSubstr("authz_policy_file: expected tls.cert_file"));
  // A daemon refuses to start on such a config.
  auto model = BuildModel(cfg);
  ASSERT_TRUE(model.ok());
  auto engine = Engine::Create(*std::move(model), TestBackend());
  ASSERT_TRUE(engine.ok());
  EXPECT_EQ(StartServer(*std::move(engine), "127.0.0.1:0").status().code(),
            absl::StatusCode::kInvalidArgument);
}

}  // namespace
}  // namespace indexer::testing

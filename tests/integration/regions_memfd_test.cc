// Host regions by memfd end to end (cpu backend): a memfd passed over the
// daemon's memfd socket, registered by token and used by committed B=16
// steps over a few thousand entries per sequence, with top-k identical to
// the inline and shm forms and checked against the shadow reference; every
// bad token, registration and socket message with its status, the field
// named and nothing changed (cache, regions, tokens, descriptors); the owner
// rule, the lease and a killed client.
#include <fcntl.h>
#include <signal.h>
#include <spawn.h>
#include <sys/mman.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/un.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <random>
#include <thread>

#include "absl/strings/match.h"
#include "client/shm_region.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "indexer/client.h"
#include "proto/memfd_wire.h"
#include "server/rpc/service.h"
#include "tests/integration/test_config.h"
#include "tests/integration/wire_harness.h"

namespace indexer::testing {
namespace {

using ::testing::Contains;
using ::testing::HasSubstr;
using ::testing::Not;
using ::testing::StartsWith;
using client::MemfdRegion;
using client::ShmRegion;

constexpr size_t kRegionBytes = 4 << 20;
const std::string kNsA = "hdr:client-a";

std::string Unique(const std::string& what) {
  static int counter = 0;
  return "idx-memfd-" + what + "-" + std::to_string(getpid()) + "-" +
         std::to_string(counter++);
}

// A directory for the memfd socket, searchable by every uid (the
// other-uid test connects from uid 65534); removed with what is left in it.
struct SocketDir {
  SocketDir() {
    char tmpl[] = "/tmp/idx-memfd-XXXXXX";
    path = mkdtemp(tmpl);
    chmod(path.c_str(), 0755);
  }
  ~SocketDir() { std::filesystem::remove_all(path); }
  std::string Socket() const { return path + "/memfd.sock"; }
  std::string path;
};

config::ServerConfig MemfdConfig(const std::string& socket, uint64_t lease_ms = 0,
                                 uint64_t ttl_ms = 0, int pages = 64, int page_entries = 16) {
  config::ServerConfig cfg = MakeConfig(
      {{.format = "fp8", .page_entries = page_entries, .num_layers = 2, .pages = pages},
       {.format = "mxfp4", .page_entries = page_entries, .compress_ratio = 4, .num_layers = 1,
        .pages = pages}});
  cfg.set_region_lease_ms(lease_ms);
  cfg.set_memfd_socket(socket);
  cfg.set_memfd_token_ttl_ms(ttl_ms);
  return cfg;
}

std::unique_ptr<IndexerClient> ClientAs(int port, const std::string& id) {
  client::ClientOptions options;
  options.client_id = id;
  auto c = IndexerClient::Connect("127.0.0.1:" + std::to_string(port), options);
  EXPECT_TRUE(c.ok()) << c.status();
  return c.ok() ? *std::move(c) : nullptr;
}

// Descriptors of this process (daemon and test alike) open on memfd `name`.
int FdsOn(const std::string& name) {
  int n = 0;
  for (const auto& e : std::filesystem::directory_iterator("/proc/self/fd")) {
    std::error_code ec;
    const std::string target = std::filesystem::read_symlink(e.path(), ec).string();
    if (!ec && target.rfind("/memfd:" + name + " ", 0) == 0) ++n;
  }
  return n;
}

// Whether this process maps memfd `name` (the daemon's region mapping; the
// test's own MemfdRegion mapping counts too, so tests close theirs first).
bool Mapped(const std::string& name) {
  std::ifstream maps("/proc/self/maps");
  std::string line;
  while (std::getline(maps, line)) {
    if (line.find("/memfd:" + name + " ") != std::string::npos) return true;
  }
  return false;
}

// One message to the memfd socket with `fds`; the reply ("" when none).
std::string Exchange(const std::string& path, const std::string& bytes,
                     const std::vector<int>& fds) {
  const int s = socket(AF_UNIX, SOCK_SEQPACKET | SOCK_CLOEXEC, 0);
  sockaddr_un addr{};
  addr.sun_family = AF_UNIX;
  std::strncpy(addr.sun_path, path.c_str(), sizeof(addr.sun_path) - 1);
  EXPECT_EQ(connect(s, reinterpret_cast<sockaddr*>(&addr), sizeof(addr)), 0) << errno;
  iovec iov{const_cast<char*>(bytes.data()), bytes.size()};
  std::vector<char> ctrl(CMSG_SPACE(sizeof(int) * std::max<size_t>(fds.size(), 1)));
  msghdr msg{};
  msg.msg_iov = &iov;
  msg.msg_iovlen = 1;
  if (!fds.empty()) {
    msg.msg_control = ctrl.data();
    msg.msg_controllen = CMSG_SPACE(sizeof(int) * fds.size());
    cmsghdr* h = CMSG_FIRSTHDR(&msg);
    h->cmsg_level = SOL_SOCKET;
    h->cmsg_type = SCM_RIGHTS;
    h->cmsg_len = CMSG_LEN(sizeof(int) * fds.size());
    std::memcpy(CMSG_DATA(h), fds.data(), sizeof(int) * fds.size());
  }
  EXPECT_GE(sendmsg(s, &msg, MSG_NOSIGNAL), 0) << errno;
  char reply[1024];
  const ssize_t n = recv(s, reply, sizeof(reply), 0);
  std::string out = n > 0 ? std::string(reply, n) : "";
  if (n > 0 && out.rfind("error ", 0) == 0) {
    // After an error the daemon drops the connection.
    EXPECT_EQ(recv(s, reply, sizeof(reply), 0), 0);
  }
  close(s);
  return out;
}

const std::string kHello(memfd_wire::kHello, memfd_wire::kHelloBytes);

// -------------------------------------------------------- steps, 3 forms --

// Where a form's tensors go: nothing (inline) or a registered region.
struct Mem {
  uint8_t* data = nullptr;
  size_t size = 0;
  uint64_t id = 0;
};

uint64_t Align16(uint64_t x) { return (x + 15) & ~uint64_t{15}; }

// One committed step over `seqs`, every tensor inline (`mem` null) or by
// reference to `mem` with the top-k through topk_out; each layer checked
// against the shadow. Returns the top-k of every layer.
std::vector<std::vector<int32_t>> Step(Daemon& d, Shadow& shadow, const std::vector<SeqStep>& seqs,
                                       IndexerClient& c, const Mem* mem) {
  std::vector<std::vector<int32_t>> out;
  auto step = c.OpenStep(Header(seqs, shadow));
  EXPECT_TRUE(step.ok()) << step.status();
  if (!step.ok()) return out;
  std::vector<LayerData> data = shadow.Make(seqs);
  for (size_t li = 0; li < d.layers().size(); ++li) {
    const TestLayer& t = d.layers()[li];
    const int64_t n = data[li].rows * t.topk;
    v1::LayerRequest r = Request(t, data[li], Form::kFloat);
    uint64_t at = 0;
    if (mem != nullptr) {
      for (v1::Tensor* x : {r.mutable_k(), r.mutable_q(), r.mutable_weights()}) {
        const std::string bytes = std::move(*x->mutable_data());
        x->clear_data();
        EXPECT_LE(at + bytes.size() + n * 4, mem->size);
        std::memcpy(mem->data + at, bytes.data(), bytes.size());
        *x->mutable_ref() = client::MakeTensorRef(mem->id, at, bytes.size());
        at = Align16(at + bytes.size());
      }
      *r.mutable_topk_out() = client::MakeTensorRef(mem->id, at, n * 4);
      std::memset(mem->data + at, 0xee, n * 4);
    }
    auto reply = (*step)->RunLayer(r);
    EXPECT_TRUE(reply.ok()) << reply.status();
    if (!reply.ok()) return out;
    std::vector<int32_t> topk(n);
    if (mem != nullptr) {
      EXPECT_TRUE(reply->topk().data().empty());
      std::memcpy(topk.data(), mem->data + at, n * 4);
    } else {
      auto read = client::ReadInt32Tensor(reply->topk(), {data[li].rows, t.topk});
      EXPECT_TRUE(read.ok()) << read.status();
      if (read.ok()) topk = *read;
    }
    shadow.Check(li, seqs, data[li], topk.data());
    out.push_back(std::move(topk));
  }
  auto committed = (*step)->Commit();
  EXPECT_TRUE(committed.ok()) << committed.status();
  shadow.Commit(seqs, data);
  EXPECT_TRUE(d.engine().CheckInvariants().ok()) << d.engine().CheckInvariants();
  return out;
}

// B = 16 sequences of 2000..2915 imported entries, then a step with q_len
// 1..3 per sequence and two decode steps: the same inputs (same seed) by
// three client identities, inline, by shm and by memfd. The top-k match the
// reference in each form and each other bit for bit.
TEST(MemfdRegions, StepsMatchInlineAndShm) {
  SocketDir dir;
  Daemon d(MemfdConfig(dir.Socket(), 0, 0, /*pages=*/2400, /*page_entries=*/64));
  auto info = d.client().GetServerInfo();
  ASSERT_TRUE(info.ok());
  EXPECT_THAT(info->features(), Contains("host_regions"));
  EXPECT_THAT(info->features(), Contains("host_regions_memfd"));
  EXPECT_EQ(info->memfd_socket(), dir.Socket());

  auto ci = ClientAs(d.port(), "fe-inline");
  auto cs = ClientAs(d.port(), "fe-shm");
  auto cm = ClientAs(d.port(), "fe-memfd");
  auto shm = ShmRegion::Create("/" + Unique("shm"), kRegionBytes);
  ASSERT_TRUE(shm.ok()) << shm.status();
  auto rs = cs->RegisterHostRegion("shm", shm->name(), 0, kRegionBytes);
  ASSERT_TRUE(rs.ok()) << rs.status();
  const std::string name = Unique("steps");
  auto memfd = MemfdRegion::Create(name, kRegionBytes);
  ASSERT_TRUE(memfd.ok()) << memfd.status();
  auto rm = cm->RegisterMemfdRegion("memfd", memfd->fd(), 0, kRegionBytes);
  ASSERT_TRUE(rm.ok()) << rm.status();
  EXPECT_EQ(FdsOn(name), 1);  // the daemon closed its copy once mapped
  EXPECT_EQ(d.service().memfd_tokens().size(), 0u);
  const Mem shm_mem{shm->data(), shm->size(), rs->region()};
  const Mem memfd_mem{memfd->data(), memfd->size(), rm->region()};

  std::vector<SeqStep> first, decode;
  for (int i = 0; i < 16; ++i) {
    first.push_back({"s" + std::to_string(i), 1 + i % 3});
    decode.push_back({"s" + std::to_string(i), 1});
  }
  struct Form3 {
    IndexerClient* c;
    const Mem* mem;
  };
  const Form3 forms[3] = {{ci.get(), nullptr}, {cs.get(), &shm_mem}, {cm.get(), &memfd_mem}};
  std::vector<std::vector<std::vector<int32_t>>> topk(3);
  for (int f = 0; f < 3; ++f) {
    Shadow shadow(d.layers(), 7);
    for (int i = 0; i < 16; ++i) {
      Import(d, shadow, *forms[f].c, "s" + std::to_string(i), 2000 + 61 * i);
    }
    for (const auto* seqs : {&first, &decode, &decode}) {
      for (auto& t : Step(d, shadow, *seqs, *forms[f].c, forms[f].mem)) {
        topk[f].push_back(std::move(t));
      }
    }
  }
  ASSERT_EQ(topk[0].size(), 3 * d.layers().size());
  EXPECT_EQ(topk[2], topk[0]) << "memfd vs inline";
  EXPECT_EQ(topk[2], topk[1]) << "memfd vs shm";

  auto list = cm->ListRegions();
  ASSERT_TRUE(list.ok());
  ASSERT_EQ(list->size(), 1u);
  EXPECT_EQ((*list)[0].region(), rm->region());
  EXPECT_EQ((*list)[0].kind(), "host");
  EXPECT_EQ((*list)[0].bytes(), kRegionBytes);
  EXPECT_THAT((*list)[0].where(),
              StartsWith("memfd:" + name + " (pid " + std::to_string(getpid()) + ")"));
  EXPECT_TRUE(cm->UnregisterRegion(rm->region()).ok());
  EXPECT_TRUE(cm->ListRegions()->empty());
  *memfd = MemfdRegion();  // the test's mapping too: the memory is gone
  EXPECT_FALSE(Mapped(name));
}

// A daemon without a memfd socket lists no feature and refuses tokens.
TEST(MemfdRegions, NoSocketNoFeature) {
  Daemon d(MemfdConfig("off"));
  auto info = d.client().GetServerInfo();
  ASSERT_TRUE(info.ok());
  EXPECT_THAT(info->features(), Not(Contains("host_regions_memfd")));
  EXPECT_EQ(info->memfd_socket(), "");
  auto reg = d.client().RegisterMemfdToken("x", std::string(32, 'a'), 0, 4096);
  EXPECT_EQ(reg.status().code(), absl::StatusCode::kFailedPrecondition) << reg.status();
  EXPECT_THAT(std::string(reg.status().message()), HasSubstr("host.memfd_token: this daemon "
                                                             "has no memfd socket"));
  auto memfd = MemfdRegion::Create(Unique("nosock"), 4096);
  ASSERT_TRUE(memfd.ok());
  EXPECT_EQ(d.client().RegisterMemfdRegion("x", memfd->fd(), 0, 4096).status().code(),
            absl::StatusCode::kFailedPrecondition);
}

// A daemon listening on a Unix socket opens its memfd socket at
// "<path>.fd" without any config; a caller over that listener (whose uid
// gRPC does not expose) redeems by token alone.
TEST(MemfdRegions, UnixListenerDefaultsToPathDotFd) {
  SocketDir dir;
  const std::string grpc_path = dir.path + "/grpc.sock";
  config::ServerConfig cfg = MemfdConfig("");
  auto model = BuildModel(cfg);
  ASSERT_TRUE(model.ok()) << model.status();
  auto engine = Engine::Create(*std::move(model), TestBackend());
  ASSERT_TRUE(engine.ok()) << engine.status();
  auto server = StartServer(*std::move(engine), "unix:" + grpc_path);
  ASSERT_TRUE(server.ok()) << server.status();
  client::ClientOptions options;
  options.client_id = "fe-unix";
  auto c = IndexerClient::Connect("unix:" + grpc_path, options);
  ASSERT_TRUE(c.ok()) << c.status();
  auto info = (*c)->GetServerInfo();
  ASSERT_TRUE(info.ok()) << info.status();
  EXPECT_EQ(info->memfd_socket(), grpc_path + ".fd");
  EXPECT_THAT(info->features(), Contains("host_regions_memfd"));
  auto m = MemfdRegion::Create(Unique("unix"), 4096);
  ASSERT_TRUE(m.ok());
  auto reg = (*c)->RegisterMemfdRegion("unix", m->fd(), 0, 4096);
  ASSERT_TRUE(reg.ok()) << reg.status();
  EXPECT_EQ((*c)->ListRegions()->size(), 1u);
  (*server)->Shutdown(0);
  EXPECT_FALSE(std::filesystem::exists(grpc_path + ".fd"));  // removed at shutdown
}

// ------------------------------------------------------------ bad input --

class MemfdErrors : public ::testing::Test {
 protected:
  MemfdErrors() : d_(MemfdConfig(dir_.Socket())), shadow_(d_.layers(), 3) {
    a_ = ClientAs(d_.port(), "client-a");
    b_ = ClientAs(d_.port(), "client-b");
  }
  void SetUp() override {
    Step(d_, shadow_, {{"a", 30}, {"b", 2}}, *a_, nullptr);
    usage_ = d_.engine().Usage();
  }
  // The token of a fresh memfd of `bytes` (kept in memfds_).
  std::string Token(size_t bytes, std::string* name = nullptr) {
    const std::string n = Unique("e");
    auto m = MemfdRegion::Create(n, bytes);
    EXPECT_TRUE(m.ok()) << m.status();
    auto token = client::SendMemfd(dir_.Socket(), m->fd());
    EXPECT_TRUE(token.ok()) << token.status();
    memfds_.push_back(*std::move(m));
    if (name != nullptr) *name = n;
    return token.ok() ? *token : "";
  }
  // `s` has `code` and names `field`; the cache, a's regions and the
  // tokens are as they were.
  void ExpectRejected(const absl::Status& s, absl::StatusCode code, const std::string& field,
                      size_t regions = 0, size_t tokens = 0) {
    EXPECT_EQ(s.code(), code) << s;
    EXPECT_THAT(std::string(s.message()), HasSubstr(field));
    d_.WaitIdle();
    EXPECT_EQ(*d_.engine().SequenceLength(SeqName::Named("a", kNsA)), 30);
    EXPECT_EQ(*d_.engine().SequenceLength(SeqName::Named("b", kNsA)), 2);
    const std::vector<GroupUsage> now = d_.engine().Usage();
    for (size_t g = 0; g < now.size(); ++g) EXPECT_EQ(now[g].free_pages, usage_[g].free_pages);
    EXPECT_TRUE(d_.engine().CheckInvariants().ok()) << d_.engine().CheckInvariants();
    EXPECT_EQ(a_->ListRegions()->size(), regions);
    EXPECT_EQ(d_.service().memfd_tokens().size(), tokens);
  }

  SocketDir dir_;
  Daemon d_;
  Shadow shadow_;
  std::unique_ptr<IndexerClient> a_, b_;
  std::vector<GroupUsage> usage_;
  std::vector<MemfdRegion> memfds_;
};

TEST_F(MemfdErrors, UnknownAndMalformedTokens) {
  ExpectRejected(a_->RegisterMemfdToken("x", std::string(32, '0'), 0, 4096).status(),
                 absl::StatusCode::kNotFound, "host.memfd_token: unknown token");
  ExpectRejected(a_->RegisterMemfdToken("x", "not-a-token", 0, 4096).status(),
                 absl::StatusCode::kInvalidArgument,
                 "host.memfd_token: expected 32 lowercase hex digits");
  ExpectRejected(a_->RegisterMemfdToken("x", std::string(32, 'G'), 0, 4096).status(),
                 absl::StatusCode::kInvalidArgument, "host.memfd_token: expected 32");
}

// A token registers one region; the second use is told apart from a typo.
TEST_F(MemfdErrors, ReusedToken) {
  const std::string token = Token(4096);
  auto first = a_->RegisterMemfdToken("x", token, 0, 4096);
  ASSERT_TRUE(first.ok()) << first.status();
  ExpectRejected(a_->RegisterMemfdToken("x", token, 0, 4096).status(),
                 absl::StatusCode::kNotFound, "host.memfd_token: token already used", 1);
  // Another client cannot use it either.
  ExpectRejected(b_->RegisterMemfdToken("x", token, 0, 4096).status(),
                 absl::StatusCode::kNotFound, "host.memfd_token: token already used", 1);
}

// Sizes and offsets are checked against the memfd; a refused registration
// leaves the token valid (nothing changed), so the corrected one succeeds.
TEST_F(MemfdErrors, BadSpansLeaveTheTokenValid) {
  const std::string token = Token(4096);
  ExpectRejected(a_->RegisterMemfdToken("x", token, 0, 8192).status(),
                 absl::StatusCode::kInvalidArgument,
                 "host.bytes: expected offset + bytes <= the memfd's size (4096 bytes of memfd:", 0,
                 1);
  ExpectRejected(a_->RegisterMemfdToken("x", token, 8192, 16).status(),
                 absl::StatusCode::kInvalidArgument,
                 "host.offset: expected < the memfd's size (4096 bytes", 0, 1);
  ExpectRejected(a_->RegisterMemfdToken("x", token, 4096, 16).status(),
                 absl::StatusCode::kInvalidArgument, "host.offset: expected < the memfd's size",
                 0, 1);
  ExpectRejected(a_->RegisterMemfdToken("x", token, 16, 16).status(),
                 absl::StatusCode::kInvalidArgument, "host.offset: expected a multiple of", 0, 1);
  ExpectRejected(a_->RegisterMemfdToken("x", token, 0, 0).status(),
                 absl::StatusCode::kInvalidArgument, "host.bytes: expected >= 1", 0, 1);
  ExpectRejected(a_->RegisterMemfdToken("", token, 0, 16).status(),
                 absl::StatusCode::kInvalidArgument, "name: expected 1..128 bytes", 0, 1);
  // shm_name and memfd_token together (the client library never sends it).
  {
    auto channel = grpc::CreateChannel("127.0.0.1:" + std::to_string(d_.port()),
                                       grpc::InsecureChannelCredentials());
    auto stub = v1::Indexer::NewStub(channel);
    grpc::ClientContext ctx;
    ctx.AddMetadata("x-indexer-client", "client-a");
    v1::RegisterRegionRequest req;
    req.set_name("both");
    req.mutable_host()->set_shm_name("/whatever");
    req.mutable_host()->set_memfd_token(token);
    req.mutable_host()->set_bytes(16);
    v1::RegisterRegionResponse resp;
    const grpc::Status s = stub->RegisterRegion(&ctx, req, &resp);
    ExpectRejected(absl::Status(static_cast<absl::StatusCode>(s.error_code()), s.error_message()),
                   absl::StatusCode::kInvalidArgument,
                   "host: expected one of shm_name and memfd_token, got both", 0, 1);
  }
  auto ok = a_->RegisterMemfdToken("x", token, 0, 4096);
  ASSERT_TRUE(ok.ok()) << ok.status();
  EXPECT_EQ(d_.service().memfd_tokens().size(), 0u);
}

// Refusals at the socket: descriptors that are no read-write, sealable memfd.
TEST_F(MemfdErrors, NotAMemfd) {
  auto refused = [&](int fd, const std::string& why) {
    auto t = client::SendMemfd(dir_.Socket(), fd);
    EXPECT_EQ(t.status().code(), absl::StatusCode::kInvalidArgument) << t.status();
    EXPECT_THAT(std::string(t.status().message()), HasSubstr(why));
    EXPECT_EQ(d_.service().memfd_tokens().size(), 0u);
  };
  int p[2];
  ASSERT_EQ(pipe(p), 0);
  refused(p[0], "fd: expected a memfd (memfd_create), got a pipe");
  close(p[0]);
  close(p[1]);
  const std::string file = dir_.path + "/plain";
  const int f = open(file.c_str(), O_RDWR | O_CREAT, 0600);
  ASSERT_GE(f, 0);
  ASSERT_EQ(ftruncate(f, 4096), 0);
  refused(f, "fd: expected a memfd (memfd_create), got a regular file of a file system");
  close(f);
  const int sock = socket(AF_UNIX, SOCK_STREAM, 0);
  refused(sock, "got a socket");
  close(sock);
  // A memfd created without MFD_ALLOW_SEALING cannot be sealed against
  // shrinking.
  const int unsealable = memfd_create(Unique("nosealing").c_str(), MFD_CLOEXEC);
  ASSERT_EQ(ftruncate(unsealable, 4096), 0);
  refused(unsealable, "fd: expected a memfd that can be sealed against shrinking");
  close(unsealable);
  // Sealed against writes: the daemon writes topk_out there.
  const int sealed = memfd_create(Unique("sealed").c_str(), MFD_CLOEXEC | MFD_ALLOW_SEALING);
  ASSERT_EQ(ftruncate(sealed, 4096), 0);
  ASSERT_EQ(fcntl(sealed, F_ADD_SEALS, F_SEAL_WRITE), 0);
  refused(sealed, "fd: expected a writable memfd");
  close(sealed);
  // Read-only: a second open of a memfd through /proc.
  auto m = MemfdRegion::Create(Unique("ro"), 4096);
  ASSERT_TRUE(m.ok());
  const int ro = open(("/proc/self/fd/" + std::to_string(m->fd())).c_str(), O_RDONLY);
  ASSERT_GE(ro, 0);
  refused(ro, "fd: expected a memfd open read-write");
  close(ro);
  ExpectRejected(absl::OkStatus(), absl::StatusCode::kOk, "");
}

// Garbage on the socket: an error reply, every descriptor it carried
// closed, the connection dropped, and the socket still serves.
TEST_F(MemfdErrors, SocketRefusesGarbage) {
  const std::string name = Unique("garbage");
  auto m = MemfdRegion::Create(name, 4096);
  ASSERT_TRUE(m.ok());
  const int fd = m->fd();
  EXPECT_EQ(Exchange(dir_.Socket(), kHello, {}),
            "error fds: expected exactly one descriptor (SCM_RIGHTS), got 0");
  EXPECT_EQ(Exchange(dir_.Socket(), kHello, {fd, fd}),
            "error fds: expected exactly one descriptor (SCM_RIGHTS), got 2");
  EXPECT_THAT(Exchange(dir_.Socket(), "indexer.memfd.v0", {fd}),
              StartsWith("error message: expected the 16 bytes \"indexer.memfd.v1\", got 16"));
  EXPECT_THAT(Exchange(dir_.Socket(), "x", {fd}), StartsWith("error message: expected the 16"));
  EXPECT_THAT(Exchange(dir_.Socket(), std::string(200, 'x'), {fd}),
              StartsWith("error message: expected the 16 bytes \"indexer.memfd.v1\", got more "
                         "than 64"));
  const std::vector<int> many(20, fd);
  EXPECT_THAT(Exchange(dir_.Socket(), kHello, many),
              StartsWith("error fds: expected exactly one descriptor (SCM_RIGHTS), got more than"));
  // Connect and go away without a word.
  {
    const int s = socket(AF_UNIX, SOCK_SEQPACKET | SOCK_CLOEXEC, 0);
    sockaddr_un addr{};
    addr.sun_family = AF_UNIX;
    std::strncpy(addr.sun_path, dir_.Socket().c_str(), sizeof(addr.sun_path) - 1);
    ASSERT_EQ(connect(s, reinterpret_cast<sockaddr*>(&addr), sizeof(addr)), 0);
    close(s);
  }
  // Every copy the daemon received was closed before it replied.
  EXPECT_EQ(FdsOn(name), 1);
  EXPECT_EQ(d_.service().memfd_tokens().size(), 0u);
  // Still serving: two memfds over one connection, then registered.
  const std::string r1 = Exchange(dir_.Socket(), kHello, {fd});
  ASSERT_THAT(r1, StartsWith("ok "));
  EXPECT_EQ(FdsOn(name), 2);  // the daemon holds its copy until the token is redeemed
  const std::string token = r1.substr(3, 32);
  ASSERT_TRUE(a_->RegisterMemfdToken("g", token, 0, 4096).ok());
  EXPECT_EQ(FdsOn(name), 1);
  ExpectRejected(absl::OkStatus(), absl::StatusCode::kOk, "", 1);
}

// The owner rule: b neither sees, uses nor unregisters a's memfd region.
TEST_F(MemfdErrors, AnotherClientsRegion) {
  auto m = MemfdRegion::Create(Unique("owned"), kRegionBytes);
  ASSERT_TRUE(m.ok());
  auto reg = a_->RegisterMemfdRegion("owned", m->fd(), 0, kRegionBytes);
  ASSERT_TRUE(reg.ok()) << reg.status();
  const Mem mem{m->data(), m->size(), reg->region()};
  EXPECT_TRUE(b_->ListRegions()->empty());
  ExpectRejected(b_->UnregisterRegion(reg->region()), absl::StatusCode::kNotFound,
                 "region " + std::to_string(reg->region()), 1);
  {
    v1::StepHeader h;
    v1::StepSequence* ss = h.add_sequences();
    *ss->mutable_id() = client::NamedSequenceId("b-own");
    ss->set_q_len(1);
    ss->set_create(true);
    auto step = b_->OpenStep(h);
    ASSERT_TRUE(step.ok()) << step.status();
    Shadow b_shadow(d_.layers(), 4);
    std::vector<LayerData> data = b_shadow.Make({{"b-own", 1}});
    v1::LayerRequest r = Request(d_.layers()[0], data[0], Form::kFloat);
    const std::string q = std::move(*r.mutable_q()->mutable_data());
    r.mutable_q()->clear_data();
    *r.mutable_q()->mutable_ref() = client::MakeTensorRef(mem.id, 0, q.size());
    ExpectRejected((*step)->RunLayer(r).status(), absl::StatusCode::kNotFound,
                   "q.ref.region: region " + std::to_string(mem.id) + " not found", 1);
  }
  Step(d_, shadow_, {{"a", 1}, {"b", 1}}, *a_, &mem);
  EXPECT_TRUE(a_->UnregisterRegion(reg->region()).ok());
}

// A token passed by another uid: refused to this caller (uid 0) and left
// for its owner. The sender is a child process that drops to uid 65534.
TEST_F(MemfdErrors, TokenFromAnotherUid) {
  if (geteuid() != 0) GTEST_SKIP() << "needs root to send from another uid";
  int out[2];
  ASSERT_EQ(pipe(out), 0);
  const std::string path = dir_.Socket();
  const pid_t pid = fork();
  ASSERT_GE(pid, 0);
  if (pid == 0) {
    // Only system calls from here: the parent has threads.
    close(out[0]);
    if (setgid(65534) != 0 || setuid(65534) != 0) _exit(2);
    const int m = memfd_create("other-uid", MFD_CLOEXEC | MFD_ALLOW_SEALING);
    if (m < 0 || ftruncate(m, 4096) != 0) _exit(3);
    const int s = socket(AF_UNIX, SOCK_SEQPACKET | SOCK_CLOEXEC, 0);
    sockaddr_un addr{};
    addr.sun_family = AF_UNIX;
    std::memcpy(addr.sun_path, path.c_str(), path.size());
    if (connect(s, reinterpret_cast<sockaddr*>(&addr), sizeof(addr)) != 0) _exit(4);
    iovec iov{const_cast<char*>(memfd_wire::kHello), memfd_wire::kHelloBytes};
    alignas(cmsghdr) char ctrl[CMSG_SPACE(sizeof(int))] = {};
    msghdr msg{};
    msg.msg_iov = &iov;
    msg.msg_iovlen = 1;
    msg.msg_control = ctrl;
    msg.msg_controllen = sizeof(ctrl);
    cmsghdr* h = CMSG_FIRSTHDR(&msg);
    h->cmsg_level = SOL_SOCKET;
    h->cmsg_type = SCM_RIGHTS;
    h->cmsg_len = CMSG_LEN(sizeof(int));
    std::memcpy(CMSG_DATA(h), &m, sizeof(int));
    if (sendmsg(s, &msg, 0) < 0) _exit(5);
    char reply[256];
    const ssize_t n = recv(s, reply, sizeof(reply), 0);
    if (n <= 0 || write(out[1], reply, n) != n) _exit(6);
    _exit(0);
  }
  close(out[1]);
  char reply[256];
  const ssize_t n = read(out[0], reply, sizeof(reply));
  close(out[0]);
  int status = 0;
  waitpid(pid, &status, 0);
  ASSERT_TRUE(WIFEXITED(status) && WEXITSTATUS(status) == 0) << status;
  ASSERT_GT(n, 0);
  const std::string text(reply, n);
  ASSERT_THAT(text, StartsWith("ok "));
  const std::string token = text.substr(3, 32);
  ExpectRejected(a_->RegisterMemfdToken("x", token, 0, 4096).status(),
                 absl::StatusCode::kPermissionDenied,
                 "host.memfd_token: the memfd was passed by uid 65534, the caller is uid 0", 0, 1);
}

// An unredeemed token expires and its memfd is closed without any call
// (the socket's tick); redeeming it then says so.
TEST(MemfdRegions, UnclaimedTokensExpire) {
  SocketDir dir;
  constexpr uint64_t kTtlMs = 100;
  Daemon d(MemfdConfig(dir.Socket(), 0, kTtlMs));
  auto c = ClientAs(d.port(), "fe-ttl");
  const std::string name = Unique("ttl");
  auto m = MemfdRegion::Create(name, 4096);
  ASSERT_TRUE(m.ok());
  auto token = client::SendMemfd(dir.Socket(), m->fd());
  ASSERT_TRUE(token.ok()) << token.status();
  // The daemon's copy goes within the TTL and a tick (25 ms) of the socket.
  const auto end = std::chrono::steady_clock::now() + std::chrono::seconds(10);
  while (FdsOn(name) != 1 && std::chrono::steady_clock::now() < end) {
    std::this_thread::sleep_for(std::chrono::milliseconds(5));
  }
  EXPECT_EQ(FdsOn(name), 1);
  EXPECT_EQ(d.service().memfd_tokens().size(), 0u);
  auto reg = c->RegisterMemfdToken("x", *token, 0, 4096);
  EXPECT_EQ(reg.status().code(), absl::StatusCode::kNotFound) << reg.status();
  EXPECT_THAT(std::string(reg.status().message()),
              HasSubstr("host.memfd_token: token expired"));
  EXPECT_TRUE(c->ListRegions()->empty());
}

// A memfd region unused for the lease is dropped and unmapped.
TEST(MemfdRegions, LeaseExpires) {
  SocketDir dir;
  constexpr uint64_t kLeaseMs = 100;
  Daemon d(MemfdConfig(dir.Socket(), kLeaseMs));
  auto c = ClientAs(d.port(), "fe-lease");
  const std::string name = Unique("lease");
  uint64_t id = 0;
  {
    auto m = MemfdRegion::Create(name, 4096);
    ASSERT_TRUE(m.ok());
    auto reg = c->RegisterMemfdRegion("lease", m->fd(), 0, 4096);
    ASSERT_TRUE(reg.ok()) << reg.status();
    EXPECT_EQ(reg->lease_ms(), kLeaseMs);
    id = reg->region();
  }  // the test's mapping and descriptor go: only the daemon's mapping is left
  EXPECT_TRUE(Mapped(name));
  std::this_thread::sleep_for(std::chrono::milliseconds(kLeaseMs + 20));
  EXPECT_TRUE(c->ListRegions()->empty());
  EXPECT_FALSE(Mapped(name));
  EXPECT_EQ(c->UnregisterRegion(id).code(), absl::StatusCode::kNotFound);
}

// A front-end (indexer-cli bench --transport host --host-region memfd)
// killed with SIGKILL while it holds a memfd region and an open step: the
// step rolls back and, after the lease, the region is gone and unmapped.
TEST(MemfdRegions, ClientKilledHoldingRegions) {
  constexpr uint64_t kLeaseMs = 1000;
  SocketDir dir;
  Daemon d(MemfdConfig(dir.Socket(), kLeaseMs));
  const std::string addr = "127.0.0.1:" + std::to_string(d.port());
  const char* cli = std::getenv("INDEXER_CLI") ? std::getenv("INDEXER_CLI") : INDEXER_CLI_PATH;
  const char* argv[] = {cli, "--addr", addr.c_str(), "--client-id", "killed", "bench",
                        "--transport", "host", "--host-region", "memfd", "--batch", "2",
                        "--context", "64", "--steps", "10000000", "--warmup", "0", nullptr};
  pid_t pid = 0;
  ASSERT_EQ(posix_spawn(&pid, cli, nullptr, nullptr, const_cast<char**>(argv), environ), 0);
  auto same = ClientAs(d.port(), "killed");
  bool holding = false;
  for (int i = 0; i < 2000 && !holding; ++i) {
    auto listed = same->ListRegions();
    holding = d.engine().open_steps() > 0 && d.engine().num_sequences() == 2 && listed.ok() &&
              !listed->empty() && absl::StartsWith((*listed)[0].where(), "memfd:");
    if (!holding) std::this_thread::sleep_for(std::chrono::milliseconds(5));
  }
  kill(pid, SIGKILL);
  int status = 0;
  waitpid(pid, &status, 0);
  ASSERT_TRUE(holding) << "the client never held a memfd region and an open step";
  EXPECT_TRUE(Mapped("indexer-cli-bench"));
  d.WaitIdle();
  EXPECT_EQ(d.engine().num_sequences(), 2);
  EXPECT_TRUE(d.engine().CheckInvariants().ok()) << d.engine().CheckInvariants();
  std::this_thread::sleep_for(std::chrono::milliseconds(kLeaseMs + 50));
  auto left = same->ListRegions();
  ASSERT_TRUE(left.ok());
  EXPECT_TRUE(left->empty());
  EXPECT_FALSE(Mapped("indexer-cli-bench"));
  EXPECT_EQ(d.service().memfd_tokens().size(), 0u);
}

}  // namespace
}  // namespace indexer::testing

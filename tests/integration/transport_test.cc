// The daemon's transport bounds (issue 9 item 2) through real sockets:
// HTTP/2 keepalive drops a peer that went silent without a reset (a
// partition, here a proxy that stops forwarding), which rolls its step back
// long before step_idle_ms would; and gRPC's resource quota (memory_quota_mb)
// bounds the memory that requests take before the service admits them.
#include <arpa/inet.h>
#include <netinet/in.h>
#include <poll.h>
#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstdio>
#include <functional>
#include <map>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include "gtest/gtest.h"
#include "tests/integration/wire_harness.h"

namespace indexer::testing {
namespace {

using Clock = std::chrono::steady_clock;

// Polls `cond` until it holds or `limit` passes.
bool WaitFor(const std::function<bool()>& cond, std::chrono::milliseconds limit) {
  const auto end = Clock::now() + limit;
  while (!cond()) {
    if (Clock::now() > end) return false;
    std::this_thread::sleep_for(std::chrono::milliseconds(2));
  }
  return true;
}

// A TCP proxy on 127.0.0.1 in front of `target_port` that can be frozen:
// once frozen it neither reads nor writes either side and closes nothing,
// as a network partition without a reset looks to both peers.
class FreezableProxy {
 public:
  explicit FreezableProxy(int target_port) : target_port_(target_port) {
    listen_fd_ = socket(AF_INET, SOCK_STREAM, 0);
    sockaddr_in a{};
    a.sin_family = AF_INET;
    a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    a.sin_port = 0;
    EXPECT_EQ(bind(listen_fd_, reinterpret_cast<sockaddr*>(&a), sizeof(a)), 0);
    EXPECT_EQ(listen(listen_fd_, 8), 0);
    socklen_t len = sizeof(a);
    getsockname(listen_fd_, reinterpret_cast<sockaddr*>(&a), &len);
    port_ = ntohs(a.sin_port);
    thread_ = std::thread([this] { Run(); });
  }
  ~FreezableProxy() { Close(); }

  int port() const { return port_; }
  void Freeze() { frozen_ = true; }
  // Ends every connection (both peers see the sockets close).
  void Close() {
    if (stop_.exchange(true)) return;
    thread_.join();
    close(listen_fd_);
  }

 private:
  struct Pair {
    int a, b;  // accepted client side, daemon side
  };

  int Dial() {
    int fd = socket(AF_INET, SOCK_STREAM, 0);
    sockaddr_in a{};
    a.sin_family = AF_INET;
    a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    a.sin_port = htons(static_cast<uint16_t>(target_port_));
    if (connect(fd, reinterpret_cast<sockaddr*>(&a), sizeof(a)) != 0) {
      close(fd);
      return -1;
    }
    return fd;
  }

  // Copies what `from` has to `to`; false when either side ended.
  static bool Pump(int from, int to) {
    char buf[65536];
    const ssize_t n = read(from, buf, sizeof(buf));
    if (n <= 0) return false;
    for (ssize_t off = 0; off < n;) {
      const ssize_t w = write(to, buf + off, static_cast<size_t>(n - off));
      if (w <= 0) return false;
      off += w;
    }
    return true;
  }

  void Run() {
    std::vector<Pair> pairs;
    while (!stop_) {
      if (frozen_) {
        // Hold every socket open and touch none of them.
        std::this_thread::sleep_for(std::chrono::milliseconds(5));
        continue;
      }
      std::vector<pollfd> fds = {{listen_fd_, POLLIN, 0}};
      for (const Pair& p : pairs) {
        fds.push_back({p.a, POLLIN, 0});
        fds.push_back({p.b, POLLIN, 0});
      }
      if (poll(fds.data(), fds.size(), 5) <= 0) continue;
      if (fds[0].revents & POLLIN) {
        const int a = accept(listen_fd_, nullptr, nullptr);
        const int b = a >= 0 ? Dial() : -1;
        if (b >= 0) {
          pairs.push_back({a, b});
        } else if (a >= 0) {
          close(a);
        }
      }
      std::vector<Pair> alive;
      for (size_t i = 0; i < pairs.size() && 1 + 2 * i + 1 < fds.size(); ++i) {
        const Pair& p = pairs[i];
        bool ok = true;
        if (fds[1 + 2 * i].revents) ok = ok && Pump(p.a, p.b);
        if (ok && fds[2 + 2 * i].revents) ok = ok && Pump(p.b, p.a);
        if (ok) {
          alive.push_back(p);
        } else {
          close(p.a);
          close(p.b);
        }
      }
      // Pairs accepted during this round have no pollfd yet.
      for (size_t i = (fds.size() - 1) / 2; i < pairs.size(); ++i) alive.push_back(pairs[i]);
      pairs = alive;
    }
    for (const Pair& p : pairs) {
      close(p.a);
      close(p.b);
    }
  }

  int target_port_;
  int listen_fd_ = -1;
  int port_ = 0;
  std::atomic<bool> frozen_{false};
  std::atomic<bool> stop_{false};
  std::thread thread_;
};

// ------------------------------------------------------------- keepalive --

// A client opens a step through the proxy, the proxy freezes: the daemon's
// keepalive ping gets no ack within keepalive_timeout_ms, the transport is
// closed, its stream cancelled, and the step rolled back. step_idle_ms is
// ten minutes, so the idle timeout cannot be what ends it.
TEST(TransportTest, KeepaliveDropsASilentPeerAndRollsItsStepBack) {
  config::ServerConfig cfg = MakeConfig({{.format = "fp8", .num_layers = 2, .pages = 64}});
  cfg.set_step_idle_ms(600000);
  cfg.set_keepalive_ms(200);
  cfg.set_keepalive_timeout_ms(500);
  Daemon d(cfg);
  Shadow shadow(d.layers(), 1);
  FreezableProxy proxy(d.port());
  auto c = IndexerClient::Connect("127.0.0.1:" + std::to_string(proxy.port()));
  ASSERT_TRUE(c.ok()) << c.status();
  // Through the proxy, a whole step works.
  WireStep(d, shadow, {{"warm", 20}}, Form::kFloat, c->get());
  const int64_t free_before = d.engine().Usage()[0].free_pages;
  auto step = (*c)->OpenStep(Header({{"silent", 100}}, shadow));
  ASSERT_TRUE(step.ok()) << step.status();
  ASSERT_TRUE(WaitFor([&] { return d.engine().open_steps() == 1; }, std::chrono::seconds(20)));
  EXPECT_EQ(d.engine().Usage()[0].free_pages, free_before - 7);  // 100 entries of 16
  const auto frozen_at = Clock::now();
  proxy.Freeze();
  ASSERT_TRUE(WaitFor(
      [&] {
        return d.engine().open_steps() == 0 && d.engine().Usage()[0].free_pages == free_before;
      },
      std::chrono::seconds(20)))
      << "the silent peer's step still holds its pages";
  const double ms = std::chrono::duration<double, std::milli>(Clock::now() - frozen_at).count();
  std::printf("[ keepalive] step rolled back %.0f ms after the peer went silent\n", ms);
  // keepalive 200 + timeout 500 ms: well inside 10 s, far from step_idle_ms.
  EXPECT_LT(ms, 10000.0);
  EXPECT_FALSE(d.engine().SequenceLength(SeqName::Named("silent")).ok());
  EXPECT_TRUE(d.engine().SequenceLength(SeqName::Named("warm")).ok());
  EXPECT_TRUE(d.engine().CheckInvariants().ok()) << d.engine().CheckInvariants();
  // The daemon serves others meanwhile.
  WireStep(d, shadow, {{"warm", 1}}, Form::kNative);
  // Closing the proxy ends the client's side of the call too.
  proxy.Close();
  step->reset();
  c->reset();
}

// ---------------------------------------------------------- memory quota --

// An import of `tokens` entries into every layer (bytes 0x11), `tokens`
// x 2 layers x 132 B on the wire.
v1::WriteEntriesRequest Import(Daemon& d, const std::string& name, int64_t tokens) {
  v1::WriteEntriesRequest w;
  *w.mutable_id() = client::NamedSequenceId(name);
  w.set_create(true);
  w.set_num_tokens(static_cast<uint64_t>(tokens));
  for (const TestLayer& t : d.layers()) {
    v1::LayerEntries* le = w.add_layers();
    le->set_layer(t.layer);
    const std::vector<uint8_t> k(static_cast<size_t>(tokens * t.layout.entry_bytes()), 0x11);
    *le->mutable_k() = client::MakeByteTensor(v1::UINT8, k, {tokens, t.layout.entry_bytes()});
  }
  return w;
}

config::ServerConfig QuotaConfig(uint64_t memory_quota_mb) {
  config::ServerConfig cfg =
      MakeConfig({{.format = "fp8", .page_entries = 64, .num_layers = 2, .pages = 4000}});
  cfg.set_max_q_len(131072);
  cfg.set_max_seq_len(131072);
  cfg.set_memory_quota_mb(memory_quota_mb);
  return cfg;
}

// What a client of gRPC 1.51 sees when the server's resource quota runs
// out: chttp2's destructive reclaimer cancels a stream with HTTP/2
// ENHANCE_YOUR_CALM, which the client maps to RESOURCE_EXHAUSTED.
void ExpectQuotaRefusal(const absl::Status& s) {
  EXPECT_EQ(s.code(), absl::StatusCode::kResourceExhausted) << s;
  EXPECT_EQ(s.message(), "Received RST_STREAM with error code 11") << s;
}

// Under pressure the quota's reclaimer may also close a whole connection
// (the client sees GOAWAY or a broken pipe): UNAVAILABLE, which a client
// retries as it does after a restart.
bool IsPressureRefusal(const absl::Status& s) {
  return (s.code() == absl::StatusCode::kResourceExhausted &&
          s.message() == "Received RST_STREAM with error code 11") ||
         s.code() == absl::StatusCode::kUnavailable;
}

struct ImportOutcome {
  absl::Status status;       // OK once it landed
  int refusals = 0;          // quota refusals before that
  bool behind_refusal = false;  // landed, but the client saw only a refusal
};

// Sends `req` until it lands (or 60 s pass), retrying the quota's refusals
// only, with a growing back-off as a serving client would use: with a fixed
// 1-20 ms one, six 8 MB imports under ASan on a loaded 2-core machine kept
// colliding (1682 refusals in 30 s, five never landed). A refusal does not prove the import will not happen: the reclaimer
// can cancel a stream whose request was already received, and the service
// imports it all the same (its executor does not look at the cancel). The
// retry then finds the sequence (ALREADY_EXISTS), possibly while the first
// import is still writing it (length 0 until it commits); the callers wait
// for it to be whole.
ImportOutcome ImportRetrying(IndexerClient& c, const v1::WriteEntriesRequest& req, int seed) {
  ImportOutcome out;
  const auto deadline = Clock::now() + std::chrono::seconds(60);
  for (int attempt = 0;; ++attempt) {
    auto r = c.WriteEntries(req);
    out.status = r.status();
    if (r.ok()) return out;
    if (attempt > 0 && r.status().code() == absl::StatusCode::kAlreadyExists) {
      out.status = absl::OkStatus();
      out.behind_refusal = true;
      return out;
    }
    if (!IsPressureRefusal(r.status()) || Clock::now() > deadline) return out;
    ++out.refusals;
    // Spread the retries so that clients do not keep colliding (a back-off,
    // not a wait for something to happen): up to 2^attempt ms, capped at
    // 256, spread by the seed.
    const int cap = 1 << std::min(attempt, 8);
    std::this_thread::sleep_for(std::chrono::milliseconds(1 + (attempt * 7 + seed * 37) % cap));
  }
}

// One request larger than the whole quota cannot be held before admission:
// it is refused, nothing of it reaches the cache, and the daemon goes on.
// The same bytes pass a daemon without a quota (it is not the message
// size limit that refuses them).
TEST(TransportTest, RequestLargerThanTheMemoryQuotaIsRefused) {
  constexpr int64_t kBig = 90000;  // 23.8 MB on the wire, quota 16 MB
  {
    Daemon unbounded(QuotaConfig(0));
    auto ok = unbounded.client().WriteEntries(Import(unbounded, "big", kBig));
    ASSERT_TRUE(ok.ok()) << ok.status();
    EXPECT_EQ(*unbounded.engine().SequenceLength(SeqName::Named("big")), kBig);
  }
  Daemon d(QuotaConfig(16));
  const int64_t free_before = d.engine().Usage()[0].free_pages;
  auto big = d.client().WriteEntries(Import(d, "big", kBig));
  ExpectQuotaRefusal(big.status());
  EXPECT_FALSE(d.engine().SequenceLength(SeqName::Named("big")).ok());
  EXPECT_EQ(d.engine().Usage()[0].free_pages, free_before);
  EXPECT_TRUE(d.engine().CheckInvariants().ok()) << d.engine().CheckInvariants();
  // A quarter of the big one passes on the same channel and lands whole
  // (retried: the refused request's buffers are returned to the quota
  // asynchronously, and until then the quota can still be short).
  ImportOutcome part = ImportRetrying(d.client(), Import(d, "part", kBig / 4), 0);
  ASSERT_TRUE(part.status.ok()) << part.status;
  ASSERT_TRUE(WaitFor(
      [&] {
        auto len = d.engine().SequenceLength(SeqName::Named("part"));
        return d.engine().open_steps() == 0 && len.ok() && *len == kBig / 4;
      },
      std::chrono::seconds(20)))
      << "the import never landed whole";
  EXPECT_EQ(d.engine().Usage()[0].free_pages, free_before - (kBig / 4 + 63) / 64);
  EXPECT_TRUE(d.engine().CheckInvariants().ok()) << d.engine().CheckInvariants();
}

// Six clients send 8 MB imports at once against a 16 MB quota. How many
// gRPC refuses depends on how the streams interleave, so the test asserts
// what does not: every failure is one of the quota's refusals, a client that
// retries gets through, every import lands whole exactly once, no page or
// sequence leaks, and the daemon serves on.
TEST(TransportTest, ConcurrentLargeRequestsUnderTheMemoryQuota) {
  constexpr int kClients = 6;
  constexpr int64_t kTokens = 30000;  // 7.9 MB each
  Daemon d(QuotaConfig(16));
  const int64_t free_before = d.engine().Usage()[0].free_pages;
  std::vector<std::unique_ptr<IndexerClient>> clients;
  std::vector<v1::WriteEntriesRequest> requests;
  for (int i = 0; i < kClients; ++i) {
    clients.push_back(d.NewClient());
    requests.push_back(Import(d, "c" + std::to_string(i), kTokens));
  }
  std::vector<ImportOutcome> outcomes(kClients);
  std::vector<std::thread> threads;
  for (int i = 0; i < kClients; ++i) {
    threads.emplace_back([&, i] { outcomes[i] = ImportRetrying(*clients[i], requests[i], i); });
  }
  for (std::thread& t : threads) t.join();
  int refusals = 0, behind = 0;
  for (const ImportOutcome& o : outcomes) {
    EXPECT_TRUE(o.status.ok()) << o.status;
    refusals += o.refusals;
    behind += o.behind_refusal;
  }
  std::printf("[  quota   ] %d refusals; %d of %d imports landed behind a refusal\n", refusals,
              behind, kClients);
  // Imports that landed behind a refusal may still be committing.
  ASSERT_TRUE(WaitFor(
      [&] {
        for (int i = 0; i < kClients; ++i) {
          auto len = d.engine().SequenceLength(SeqName::Named("c" + std::to_string(i)));
          if (!len.ok() || *len != kTokens) return false;
        }
        return d.engine().open_steps() == 0;
      },
      std::chrono::seconds(20)))
      << "not every import landed whole";
  EXPECT_EQ(d.engine().Usage()[0].free_pages, free_before - kClients * ((kTokens + 63) / 64));
  EXPECT_EQ(d.engine().open_steps(), 0);
  EXPECT_TRUE(d.engine().CheckInvariants().ok()) << d.engine().CheckInvariants();
  // The daemon serves on (retried: the quota gets the refused requests'
  // buffers back asynchronously, and a small request can meet the end of
  // that).
  ImportOutcome after = ImportRetrying(d.client(), Import(d, "after", 1000), 0);
  EXPECT_TRUE(after.status.ok()) << after.status;
  EXPECT_TRUE(WaitFor(
      [&] {
        auto len = d.engine().SequenceLength(SeqName::Named("after"));
        return len.ok() && *len == 1000 && d.engine().open_steps() == 0;
      },
      std::chrono::seconds(20)));
}

}  // namespace
}  // namespace indexer::testing

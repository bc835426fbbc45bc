// Trust under real traffic (issue 9 items 2, 3, 5) through the wire: idle
// steps rolled back, per-client quotas (two clients told apart by the
// x-indexer-client header: one refused, the other served), a control plane
// that answers while the cpu backend is saturated, and error texts that name
// the request, its own fields, escape names and stay short.
#include <stdio.h>
#include <sys/wait.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <condition_variable>
#include <functional>
#include <mutex>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

#include "gmock/gmock.h"
#include "grpcpp/generic/generic_stub.h"
#include "gtest/gtest.h"
#include "server/rpc/log_safe.h"
#include "server/rpc/quota.h"
#include "spdlog/sinks/base_sink.h"
#include "spdlog/sinks/ostream_sink.h"
#include "spdlog/spdlog.h"
#include "tests/integration/wire_harness.h"
#include "tests/sanitized_build.h"

namespace indexer::testing {
namespace {

using ::testing::HasSubstr;
using ::testing::Not;
using Clock = std::chrono::steady_clock;

// Polls `cond` until it holds or `limit` passes.
bool WaitFor(const std::function<bool()>& cond,
             std::chrono::milliseconds limit = std::chrono::seconds(20)) {
  const auto end = Clock::now() + limit;
  while (!cond()) {
    if (Clock::now() > end) return false;
    std::this_thread::sleep_for(std::chrono::milliseconds(2));
  }
  return true;
}

// The daemon's log while it lives: the idle watch's rollback is an event
// the tests wait on (a fixed sleep would race the watch on a loaded machine).
class LogWatch : public spdlog::sinks::base_sink<std::mutex> {
 public:
  static std::shared_ptr<LogWatch> Install() {
    auto watch = std::make_shared<LogWatch>();
    watch->previous_ = spdlog::default_logger();
    spdlog::set_default_logger(std::make_shared<spdlog::logger>("trust_test", watch));
    return watch;
  }
  ~LogWatch() override = default;
  void Uninstall() { spdlog::set_default_logger(previous_); }
  bool Saw(const std::string& text) {
    std::lock_guard<std::mutex> lock(text_mu_);
    return text_.find(text) != std::string::npos;
  }

 protected:
  void sink_it_(const spdlog::details::log_msg& msg) override {
    std::lock_guard<std::mutex> lock(text_mu_);
    text_.append(msg.payload.data(), msg.payload.size());
    text_ += '\n';
  }
  void flush_() override {}

 private:
  std::shared_ptr<spdlog::logger> previous_;
  std::mutex text_mu_;
  std::string text_;
};

// Installs a LogWatch for its scope (declare it before the Daemon, so that
// the daemon's last lines go to it too).
struct ScopedLogWatch {
  std::shared_ptr<LogWatch> watch = LogWatch::Install();
  ~ScopedLogWatch() { watch->Uninstall(); }
  LogWatch* operator->() { return watch.get(); }
};

std::unique_ptr<IndexerClient> ClientAs(Daemon& d, const std::string& who) {
  client::ClientOptions o;
  o.client_id = who;
  auto c = IndexerClient::Connect("127.0.0.1:" + std::to_string(d.port()), o);
  EXPECT_TRUE(c.ok()) << c.status();
  return c.ok() ? *std::move(c) : nullptr;
}

// The status a step ends with when the daemon refuses its header.
absl::Status HeaderStatus(IndexerClient& c, const v1::StepHeader& h) {
  auto step = c.OpenStep(h);
  return step.ok() ? (*step)->RunLayer(v1::LayerRequest()).status() : step.status();
}

// One unary call on raw bytes; returns its status.
grpc::Status RawUnary(grpc::GenericStub& stub, const std::string& method, const std::string& bytes,
                      std::string* reply = nullptr) {
  grpc::ClientContext ctx;
  grpc::Slice slice(bytes);
  grpc::ByteBuffer request(&slice, 1), response;
  std::mutex mu;
  std::condition_variable cv;
  bool done = false;
  grpc::Status status;
  stub.UnaryCall(&ctx, method, grpc::StubOptions(), &request, &response, [&](grpc::Status s) {
    std::lock_guard<std::mutex> lock(mu);
    status = s;
    done = true;
    cv.notify_one();
  });
  std::unique_lock<std::mutex> lock(mu);
  cv.wait(lock, [&] { return done; });
  if (reply != nullptr && status.ok()) {
    std::vector<grpc::Slice> slices;
    (void)response.Dump(&slices);
    reply->clear();
    for (const auto& sl : slices) reply->append(reinterpret_cast<const char*>(sl.begin()), sl.size());
  }
  return status;
}

grpc::Status RawUnary(int port, const std::string& method, const std::string& bytes,
                      std::string* reply = nullptr) {
  grpc::GenericStub stub(grpc::CreateChannel("127.0.0.1:" + std::to_string(port),
                                             grpc::InsecureChannelCredentials()));
  return RawUnary(stub, method, bytes, reply);
}

// ------------------------------------------------------ step idle timeout --

TEST(TrustTest, IdleHeaderOnlyStepIsRolledBack) {
  config::ServerConfig cfg = MakeConfig({{.format = "fp8", .num_layers = 2, .pages = 64}});
  cfg.set_step_idle_ms(400);
  ScopedLogWatch watch;
  Daemon d(cfg);
  Shadow shadow(d.layers(), 1);
  // A step whose messages keep coming is not touched by the timeout.
  WireStep(d, shadow, {{"busy", 40}}, Form::kFloat);
  const int64_t free_before = d.engine().Usage()[0].free_pages;
  auto step = d.client().OpenStep(Header({{"idle", 100}}, shadow));
  ASSERT_TRUE(step.ok()) << step.status();
  // The header reserved pages: 100 entries of 16 = 7 pages. Checked unless
  // this process stalled past the idle time first (a loaded machine): the
  // rollback logs before it frees, so pages read before the line is seen
  // are the open step's.
  ASSERT_TRUE(WaitFor([&] { return d.engine().open_steps() == 1 || watch->Saw("idle for"); }));
  const int64_t free_open = d.engine().Usage()[0].free_pages;
  if (!watch->Saw("idle for")) EXPECT_EQ(free_open, free_before - 7);
  // ... and nothing else comes: the daemon rolls it back on its own.
  ASSERT_TRUE(WaitFor([&] { return watch->Saw("idle for"); })) << "the idle step never expired";
  ASSERT_TRUE(WaitFor([&] {
    return d.engine().open_steps() == 0 && d.engine().Usage()[0].free_pages == free_before;
  })) << "the idle step still holds its pages";
  EXPECT_FALSE(d.engine().SequenceLength(SeqName::Named("idle")).ok());
  EXPECT_TRUE(d.engine().CheckInvariants().ok()) << d.engine().CheckInvariants();
  auto late = (*step)->RunLayer(v1::LayerRequest());
  EXPECT_EQ(late.status().code(), absl::StatusCode::kDeadlineExceeded) << late.status();
  EXPECT_THAT(std::string(late.status().message()), HasSubstr("step_idle_ms = 400"));
  // The committed sequence is untouched and steps go on.
  WireStep(d, shadow, {{"busy", 1}}, Form::kNative);
}

// A client that sends a layer and never takes its 16 MB reply: the write
// stalls on HTTP/2 flow control, and the step is rolled back all the same.
TEST(TrustTest, StepWhoseReplyIsNeverTakenIsRolledBack) {
  config::ServerConfig cfg = MakeConfig({{.format = "fp8", .page_entries = 64, .num_layers = 1,
                                          .heads = 1, .topk = 1024, .pages = 256}});
  cfg.set_max_q_len(8192);
  cfg.set_step_idle_ms(300);
  ScopedLogWatch watch;
  Daemon d(cfg);
  Shadow shadow(d.layers(), 6);
  const std::vector<SeqStep> seqs = {{"w", 4096}};
  std::vector<LayerData> data = shadow.Make(seqs);
  v1::StepRequest header, layer;
  *header.mutable_header() = Header(seqs, shadow);
  *layer.mutable_layer() = Request(d.layers()[0], data[0], Form::kNative);

  grpc::GenericStub stub(grpc::CreateChannel("127.0.0.1:" + std::to_string(d.port()),
                                             grpc::InsecureChannelCredentials()));
  grpc::ClientContext ctx;
  grpc::CompletionQueue cq;
  auto call = stub.PrepareCall(&ctx, "/indexer.v1.Indexer/Step", &cq);
  auto tag = [](intptr_t i) { return reinterpret_cast<void*>(i); };
  auto await = [&](intptr_t want) {
    void* got;
    bool ok;
    return cq.Next(&got, &ok) && got == tag(want) && ok;
  };
  call->StartCall(tag(1));
  ASSERT_TRUE(await(1));
  for (const v1::StepRequest* m : {&header, &layer}) {
    grpc::Slice slice(m->SerializeAsString());
    call->Write(grpc::ByteBuffer(&slice, 1), tag(2));
    ASSERT_TRUE(await(2));
  }
  // Never read: the reply (4096 x 1024 int32) cannot be delivered, and the
  // idle watch rolls the admitted step back (its log line is the event:
  // open_steps could go 0 -> 1 -> 0 between two looks on a loaded machine).
  ASSERT_TRUE(WaitFor([&] { return watch->Saw("idle for"); })) << "the step never expired";
  ASSERT_TRUE(WaitFor([&] {
    return d.engine().open_steps() == 0 && d.engine().Usage()[0].free_pages == 256;
  })) << "the step whose reply is not taken still holds its pages";
  EXPECT_FALSE(d.engine().SequenceLength(SeqName::Named("w")).ok());
  EXPECT_TRUE(d.engine().CheckInvariants().ok()) << d.engine().CheckInvariants();
  ctx.TryCancel();
  cq.Shutdown();
  void* t;
  bool ok;
  while (cq.Next(&t, &ok)) {
  }
}

// ---------------------------------------------------------------- quotas --

TEST(TrustTest, OpenStepsQuotaPerClient) {
  config::ServerConfig cfg = MakeConfig({{.format = "fp8", .num_layers = 2, .pages = 64}});
  cfg.mutable_client_quota()->set_max_open_steps(2);
  Daemon d(cfg);
  Shadow shadow(d.layers(), 2);
  auto x = ClientAs(d, "x");
  auto y = ClientAs(d, "y");
  auto s1 = x->OpenStep(Header({{"x1", 4}}, shadow));
  auto s2 = x->OpenStep(Header({{"x2", 4}}, shadow));
  ASSERT_TRUE(s1.ok() && s2.ok());
  ASSERT_TRUE(WaitFor([&] { return d.engine().open_steps() == 2; }));
  absl::Status third = HeaderStatus(*x, Header({{"x3", 4}}, shadow));
  EXPECT_EQ(third.code(), absl::StatusCode::kResourceExhausted) << third;
  EXPECT_THAT(std::string(third.message()),
              HasSubstr("client_quota.max_open_steps: client \"hdr:x\" has 2 open steps, limit 2"));
  // Another client is still served.
  WireStep(d, shadow, {{"y1", 5}}, Form::kFloat, y.get());
  // The quota comes back when x's steps end.
  (*s1)->Abort();
  ASSERT_TRUE(WaitFor([&] { return d.engine().open_steps() == 1; }));
  WireStep(d, shadow, {{"x4", 3}}, Form::kNative, x.get());
  (*s2)->Abort();
  d.WaitIdle();
  EXPECT_TRUE(d.engine().CheckInvariants().ok()) << d.engine().CheckInvariants();
}

TEST(TrustTest, ReservedPagesQuotaPerClient) {
  // 64 pages of 16 entries; 50 % = 32 pages per client in open steps.
  config::ServerConfig cfg = MakeConfig({{.format = "fp8", .num_layers = 2, .pages = 64}});
  cfg.mutable_client_quota()->set_max_reserved_pct(50);
  Daemon d(cfg);
  Shadow shadow(d.layers(), 3);
  auto x = ClientAs(d, "x");
  auto y = ClientAs(d, "y");
  auto s1 = x->OpenStep(Header({{"x1", 320}}, shadow));  // 20 pages
  ASSERT_TRUE(s1.ok());
  ASSERT_TRUE(WaitFor([&] { return d.engine().open_steps() == 1; }));
  absl::Status second = HeaderStatus(*x, Header({{"x2", 320}}, shadow));
  EXPECT_EQ(second.code(), absl::StatusCode::kResourceExhausted) << second;
  EXPECT_THAT(std::string(second.message()),
              HasSubstr("client_quota.max_reserved_pct: client \"hdr:x\" has 20 pages of layer "
                        "group 'g0' reserved by open steps and this step needs 20 more, limit 32"));
  // The refused step's pages are free again at once.
  EXPECT_EQ(d.engine().open_steps(), 1);
  EXPECT_EQ(d.engine().Usage()[0].free_pages, 64 - 20);
  WireStep(d, shadow, {{"y1", 320}}, Form::kFloat, y.get());
  (*s1)->Abort();
  d.WaitIdle();
  EXPECT_TRUE(d.engine().CheckInvariants().ok()) << d.engine().CheckInvariants();
}

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

TEST(TrustTest, BytesInFlightQuotaPerClient) {
  config::ServerConfig cfg = MakeConfig({{.format = "fp8", .num_layers = 2, .pages = 400}});
  cfg.set_max_q_len(8192);
  cfg.mutable_client_quota()->set_max_bytes_in_flight_mb(1);
  Daemon d(cfg);
  auto x = ClientAs(d, "x");
  auto y = ClientAs(d, "y");
  // 5000 tokens x 2 layers x 132 B: 1.3 MB in one request, over 1 MiB.
  auto big = x->WriteEntries(Import(d, "xbig", 5000));
  EXPECT_EQ(big.status().code(), absl::StatusCode::kResourceExhausted) << big.status();
  EXPECT_THAT(std::string(big.status().message()),
              HasSubstr("client_quota.max_bytes_in_flight_mb: client \"hdr:x\" has 0 request "
                        "bytes in flight and this request adds 13"));
  EXPECT_THAT(std::string(big.status().message()), HasSubstr("limit 1048576 bytes"));
  EXPECT_FALSE(d.engine().SequenceLength(SeqName::Named("xbig")).ok());
  // 0.5 MB requests pass, for both clients; nothing stays counted.
  auto ok_y = y->WriteEntries(Import(d, "ysmall", 2000));
  EXPECT_TRUE(ok_y.ok()) << ok_y.status();
  auto ok_x = x->WriteEntries(Import(d, "xsmall", 2000));
  EXPECT_TRUE(ok_x.ok()) << ok_x.status();
  EXPECT_TRUE(d.engine().CheckInvariants().ok()) << d.engine().CheckInvariants();
}

// Bytes in flight add up per client: what one client holds does not count
// against another, and comes back when released.
TEST(QuotaUnitTest, BytesAddUpPerClient) {
  ClientQuotas q({4, 50, 1000}, {100}, {"g"});
  ClientQuotas::Hold a, b, c;
  ASSERT_TRUE(q.TakeBytes("x", 800, &a).ok());
  absl::Status more = q.TakeBytes("x", 300, &b);
  EXPECT_EQ(more.code(), absl::StatusCode::kResourceExhausted);
  EXPECT_THAT(std::string(more.message()), HasSubstr("has 800 request bytes in flight"));
  EXPECT_TRUE(q.TakeBytes("y", 800, &c).ok());
  a.Reset();
  EXPECT_EQ(q.bytes_in_flight("x"), 0);
  EXPECT_TRUE(q.TakeBytes("x", 300, &b).ok());
  EXPECT_EQ(q.bytes_in_flight("x"), 300);
  EXPECT_EQ(q.bytes_in_flight("y"), 800);
  // The anonymous client is one client.
  ClientQuotas::Hold s1, s2, s3, s4, s5;
  for (auto* h : {&s1, &s2, &s3, &s4}) ASSERT_TRUE(q.OpenStep("", h).ok());
  absl::Status fifth = q.OpenStep("", &s5);
  EXPECT_THAT(std::string(fifth.message()), HasSubstr("client anonymous has 4 open steps"));
}

// ------------------------------------------------ a control plane answers --

// Health checks answer within 10 ms (p99 of >= 250) while three clients keep
// the cpu backend busy with prefill layers. Layer work runs on the
// service's executor; on gRPC's callback threads (the old design) the
// checks queued behind layers for seconds.
TEST(TrustTest, HealthAnswersWhileTheBackendIsSaturated) {
  config::ServerConfig cfg =
      MakeConfig({{.format = "fp8", .page_entries = 64, .num_layers = 2, .heads = 16,
                   .topk = 64, .pages = 4096}});
  cfg.set_max_q_len(8192);
  Daemon d(cfg);
  constexpr int kClients = 3;
  constexpr int64_t kRows = 1024;
  std::atomic<bool> stop{false};
  std::atomic<int64_t> layers_done{0};
  std::vector<std::thread> load;
  for (int c = 0; c < kClients; ++c) {
    load.emplace_back([&, c] {
      auto client = d.NewClient();
      Shadow shadow(d.layers(), 100 + c);
      const std::vector<SeqStep> seqs = {{"load", kRows}};
      std::vector<LayerData> data = shadow.Make(seqs);
      std::vector<v1::LayerRequest> reqs;
      for (size_t li = 0; li < d.layers().size(); ++li) {
        reqs.push_back(Request(d.layers()[li], data[li], Form::kNative));
      }
      for (int n = 0; !stop.load(); ++n) {
        v1::StepHeader h;
        v1::StepSequence* s = h.add_sequences();
        *s->mutable_id() = client::NamedSequenceId(absl::StrCat("c", c, "-", n));
        s->set_q_len(kRows);
        s->set_create(true);
        auto step = client->OpenStep(h);
        ASSERT_TRUE(step.ok()) << step.status();
        for (const v1::LayerRequest& r : reqs) {
          auto reply = (*step)->RunLayer(r);
          ASSERT_TRUE(reply.ok()) << reply.status();
          layers_done.fetch_add(1);
        }
        (*step)->Abort();
      }
    });
  }
  // Saturated: every client has a step open.
  ASSERT_TRUE(WaitFor([&] { return d.engine().open_steps() == kClients; }));
  // One channel, as a liveness probe's client keeps (connected first).
  grpc::GenericStub stub(grpc::CreateChannel("127.0.0.1:" + std::to_string(d.port()),
                                             grpc::InsecureChannelCredentials()));
  ASSERT_TRUE(RawUnary(stub, "/grpc.health.v1.Health/Check", "").ok());
  std::vector<double> ms;
  const int64_t layers_before = layers_done.load();
  // At least 250 checks, and on until a layer has finished meanwhile (an
  // ASan build on two loaded cores can take seconds per prefill layer), for
  // at most a minute.
  const auto window_end = Clock::now() + std::chrono::seconds(60);
  for (int i = 0; i < 250 || (layers_done.load() == layers_before && Clock::now() < window_end);
       ++i) {
    const auto t0 = Clock::now();
    std::string reply;
    grpc::Status s = RawUnary(stub, "/grpc.health.v1.Health/Check", "", &reply);
    ms.push_back(std::chrono::duration<double, std::milli>(Clock::now() - t0).count());
    ASSERT_TRUE(s.ok()) << s.error_message();
    ASSERT_EQ(reply, std::string("\x08\x01", 2));
    // Paced as a probe is, so that the checks span several layers.
    std::this_thread::sleep_for(std::chrono::milliseconds(5));
  }
  auto info_t0 = Clock::now();
  auto info = d.client().GetServerInfo();
  const double info_ms = std::chrono::duration<double, std::milli>(Clock::now() - info_t0).count();
  const int64_t layers_during = layers_done.load() - layers_before;
  const int open_during = d.engine().open_steps();
  stop = true;
  for (std::thread& t : load) t.join();
  ASSERT_TRUE(info.ok()) << info.status();
  std::sort(ms.begin(), ms.end());
  const double p50 = ms[ms.size() / 2], p99 = ms[ms.size() * 99 / 100 - 1];
  std::printf("[  health  ] p50 %.2f ms, p99 %.2f ms, max %.2f ms over %zu checks; "
              "GetServerInfo %.2f ms; %lld layers ran meanwhile\n",
              p50, p99, ms.back(), ms.size(), info_ms, static_cast<long long>(layers_during));
  EXPECT_GT(open_during, 0) << "the load ended before the checks did";
  EXPECT_GT(layers_during, 0) << "no layer ran while the checks did";
  // A check stuck behind the backend would wait a layer (90-300 ms here,
  // 1024 rows); the bound is 10 ms, 50 ms in a sanitizer build, where every
  // thread runs several times slower and the two CI cores are shared with
  // the other tests (ASan: p99 12.5 ms once, with layers of 290 ms).
  EXPECT_LT(p99, kSanitized ? 50.0 : 10.0);
  EXPECT_LT(info_ms, 100.0);
  d.WaitIdle();
  EXPECT_TRUE(d.engine().CheckInvariants().ok()) << d.engine().CheckInvariants();
}

// ---------------------------------------------------------------- errors --

TEST(TrustTest, UndecodableUnaryRequestsNameTheirType) {
  Daemon d(MakeConfig({{.format = "fp8", .num_layers = 1, .pages = 4}}));
  const std::string junk = "\x0a\xff\xff\xff";  // field 1, truncated length
  for (const auto& [method, type] :
       std::vector<std::pair<std::string, std::string>>{
           {"GetServerInfo", "GetServerInfoRequest"},
           {"Release", "ReleaseRequest"},
           {"WriteEntries", "WriteEntriesRequest"}}) {
    grpc::Status s = RawUnary(d.port(), "/indexer.v1.Indexer/" + method, junk);
    EXPECT_EQ(s.error_code(), grpc::StatusCode::INVALID_ARGUMENT) << method;
    EXPECT_THAT(s.error_message(), HasSubstr("request: expected a " + type + " message"));
  }
  // Well-formed bytes still work on the raw methods.
  std::string reply;
  ASSERT_TRUE(RawUnary(d.port(), "/indexer.v1.Indexer/GetServerInfo", "", &reply).ok());
  v1::ServerInfo info;
  ASSERT_TRUE(info.ParseFromString(reply));
  EXPECT_EQ(info.profile(), "test");
}

TEST(TrustTest, WriteEntriesErrorsNameItsOwnFields) {
  config::ServerConfig cfg = MakeConfig({{.format = "fp8", .num_layers = 2, .pages = 64}});
  cfg.set_max_seq_len(100);
  Daemon d(cfg);
  v1::WriteEntriesRequest w = Import(d, "imp", 60);
  ASSERT_TRUE(d.client().WriteEntries(w).ok());
  auto again = d.client().WriteEntries(w);  // create = true again
  EXPECT_EQ(again.status().code(), absl::StatusCode::kAlreadyExists);
  EXPECT_THAT(std::string(again.status().message()), HasSubstr("id: sequence \"imp\" already exists"));
  w.set_create(false);
  auto too_long = d.client().WriteEntries(w);
  EXPECT_EQ(too_long.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(std::string(too_long.status().message()),
              HasSubstr("num_tokens: sequence would hold 120 tokens"));
  *w.mutable_id() = client::NamedSequenceId("nope");
  auto unknown = d.client().WriteEntries(w);
  EXPECT_EQ(unknown.status().code(), absl::StatusCode::kNotFound);
  EXPECT_THAT(std::string(unknown.status().message()), HasSubstr("id: unknown sequence \"nope\""));
  for (const auto& s : {again.status(), too_long.status(), unknown.status()}) {
    EXPECT_THAT(std::string(s.message()), Not(HasSubstr("header")));
  }
}

TEST(TrustTest, ErrorTextsAreCappedAndNamesEscaped) {
  Daemon d(MakeConfig({{.format = "fp8", .num_layers = 1, .pages = 16}}));
  Shadow shadow(d.layers(), 4);
  // A q of a 300,000-dimension shape: the status stays within 1 KiB.
  const std::vector<SeqStep> seqs = {{"s", 2}};
  auto step = d.client().OpenStep(Header(seqs, shadow));
  ASSERT_TRUE(step.ok());
  std::vector<LayerData> data = shadow.Make(seqs);
  v1::LayerRequest r = Request(d.layers()[0], data[0], Form::kFloat);
  r.mutable_q()->clear_shape();
  for (int i = 0; i < 300000; ++i) r.mutable_q()->add_shape(1);
  auto bad = (*step)->RunLayer(r);
  EXPECT_EQ(bad.status().code(), absl::StatusCode::kInvalidArgument) << bad.status().message().substr(0, 200);
  EXPECT_LE(bad.status().message().size(), kMaxErrorBytes);
  EXPECT_THAT(std::string(bad.status().message()), HasSubstr("bytes cut)"));
  // A name with a newline cannot start a line of its own.
  auto r2 = d.client().Release({client::NamedSequenceId("evil\n2026-01-01 info forged")});
  EXPECT_EQ(r2.status().code(), absl::StatusCode::kNotFound);
  EXPECT_THAT(std::string(r2.status().message()), HasSubstr("\"evil\\n2026-01-01 info forged\""));
  EXPECT_THAT(std::string(r2.status().message()), Not(HasSubstr("\n")));
  d.WaitIdle();
}

// The daemon's log under a flood of rejections and hostile input: one
// admission warning a second (with a count), short lines, and no line that
// a request id can forge.
TEST(TrustTest, LogsStayShortUnforgeableAndRateLimited) {
  std::ostringstream log;
  auto previous = spdlog::default_logger();
  spdlog::set_default_logger(std::make_shared<spdlog::logger>(
      "trust_test", std::make_shared<spdlog::sinks::ostream_sink_mt>(log)));
  const auto t0 = Clock::now();
  {
    config::ServerConfig cfg = MakeConfig({{.format = "fp8", .num_layers = 1, .pages = 64}});
    cfg.mutable_client_quota()->set_max_open_steps(1);
    Daemon d(cfg);
    Shadow shadow(d.layers(), 5);
    auto x = ClientAs(d, "x");
    auto y = ClientAs(d, "y");
    auto held = x->OpenStep(Header({{"held", 1}}, shadow));
    ASSERT_TRUE(held.ok());
    ASSERT_TRUE(WaitFor([&] { return d.engine().open_steps() == 1; }));
    for (int i = 0; i < 40; ++i) {
      absl::Status s = HeaderStatus(*x, Header({{"flood" + std::to_string(i), 1}}, shadow));
      ASSERT_EQ(s.code(), absl::StatusCode::kResourceExhausted) << s;
    }
    // A request id with a newline, then a layer with a 300,000-entry shape.
    v1::StepHeader h = Header({{"s", 2}}, shadow);
    h.set_request_id("req\nFORGED line");
    auto step = y->OpenStep(h);
    ASSERT_TRUE(step.ok());
    std::vector<LayerData> data = shadow.Make({{"s", 2}});
    v1::LayerRequest r = Request(d.layers()[0], data[0], Form::kFloat);
    for (int i = 0; i < 300000; ++i) r.mutable_q()->add_shape(1);
    EXPECT_FALSE((*step)->RunLayer(r).ok());
    (*held)->Abort();
    d.WaitIdle();
  }
  const double seconds = std::chrono::duration<double>(Clock::now() - t0).count();
  spdlog::set_default_logger(previous);
  std::istringstream lines(log.str());
  std::string line;
  int quota_lines = 0, request_lines = 0;
  while (std::getline(lines, line)) {
    EXPECT_LE(line.size(), kMaxErrorBytes + 200) << line.substr(0, 200);
    EXPECT_NE(line.rfind("FORGED", 0), 0u) << "a request id started a line: " << line;
    if (line.find("client_quota.max_open_steps") != std::string::npos) ++quota_lines;
    if (line.find("[req\\nFORGED line]") != std::string::npos) ++request_lines;
  }
  EXPECT_GE(quota_lines, 1);
  EXPECT_LE(quota_lines, 1 + static_cast<int>(seconds)) << log.str();
  EXPECT_EQ(request_lines, 1) << log.str();
}

TEST(LogSafeTest, CapsAndEscapes) {
  const std::string big(1 << 20, 'x');
  const std::string capped = CapText(big);
  EXPECT_LE(capped.size(), kMaxErrorBytes);
  EXPECT_THAT(capped, HasSubstr("bytes cut)"));
  EXPECT_EQ(CapText("short"), "short");
  EXPECT_EQ(LogSafe("a\nb\"c"), "a\\nb\\\"c");
  const std::string id = LogSafe(std::string(5000, '\n'), 128);
  EXPECT_THAT(id, Not(HasSubstr("\n")));
  EXPECT_LE(id.size(), 128u + 32u);
}

TEST(LogSafeTest, RateLimiterLetsOnePerSecondAndCounts) {
  RateLimiter limiter(std::chrono::seconds(1));
  const auto t0 = RateLimiter::Clock::time_point() + std::chrono::hours(1);
  int64_t suppressed = -1;
  EXPECT_TRUE(limiter.Allow(t0, &suppressed));
  EXPECT_EQ(suppressed, 0);
  for (int i = 1; i <= 500; ++i) {
    EXPECT_FALSE(limiter.Allow(t0 + std::chrono::milliseconds(i), &suppressed));
  }
  EXPECT_TRUE(limiter.Allow(t0 + std::chrono::milliseconds(1000), &suppressed));
  EXPECT_EQ(suppressed, 500);
  EXPECT_FALSE(limiter.Allow(t0 + std::chrono::milliseconds(1500), &suppressed));
  EXPECT_TRUE(limiter.Allow(t0 + std::chrono::milliseconds(2100), &suppressed));
  EXPECT_EQ(suppressed, 1);
}

// A port file that cannot be written ends the daemon with a message and a
// non-zero status (whoever waits on the file would wait forever).
TEST(TrustTest, UnwritablePortFileEndsTheDaemon) {
  const std::string cmd = std::string(INDEXERD_PATH) +
                          " --profile demo --device cpu --cache-mb 64 --listen 127.0.0.1:0"
                          " --port-file /nonexistent-dir/indexerd/port.txt 2>&1";
  FILE* p = popen(cmd.c_str(), "r");
  ASSERT_NE(p, nullptr);
  std::string out;
  char buf[4096];
  size_t n;
  while ((n = fread(buf, 1, sizeof(buf), p)) > 0) out.append(buf, n);
  const int status = pclose(p);
  ASSERT_TRUE(WIFEXITED(status)) << out;
  EXPECT_NE(WEXITSTATUS(status), 0) << out;
  EXPECT_THAT(out, HasSubstr("--port-file: cannot write /nonexistent-dir/indexerd/port.txt"));
}

}  // namespace
}  // namespace indexer::testing

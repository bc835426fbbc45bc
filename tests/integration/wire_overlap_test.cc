// Steps forced to overlap, and shutdown while work is in flight. Ordering is
// made by events (a barrier, turns, a gate inside the backend), never by
// sleeps: two clients' steps both open with their layers interleaved; and
// RunningServer::Shutdown while a step's layer (or an import) is inside the
// backend.
#include <atomic>
#include <barrier>
#include <chrono>
#include <condition_variable>
#include <cstdio>
#include <cstdlib>
#include <memory>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include "grpcpp/generic/generic_stub.h"
#include "gtest/gtest.h"
#include "indexer/client.h"
#include "kernels/cpu/cpu_backend.h"
#include "kernels/forwarding_backend.h"
#include "server/rpc/server.h"
#include "tests/integration/test_config.h"
#include "tests/integration/wire_harness.h"

namespace indexer::testing {
namespace {

using Clock = std::chrono::steady_clock;
constexpr auto kDeadline = std::chrono::seconds(30);

// Polls `done` until it holds or kDeadline passes (conditions owned by the
// daemon, which offers no event to wait on).
template <typename F>
bool PollUntil(F done) {
  const auto end = Clock::now() + kDeadline;
  while (!done()) {
    if (Clock::now() > end) return false;
    // A short pause between looks, not a timing assumption: the CI machine
    // has two cores the daemon needs too.
    std::this_thread::sleep_for(std::chrono::milliseconds(1));
  }
  return true;
}

// ------------------------------------------------------- overlapping steps --

// Whose turn it is: layer i of client c runs at turn 2 i + c.
class Turns {
 public:
  bool Wait(int turn) {
    std::unique_lock<std::mutex> lock(mu_);
    return cv_.wait_until(lock, Clock::now() + kDeadline,
                          [&] { return turn_ == turn || failed_; }) &&
           !failed_;
  }
  void Next() {
    std::lock_guard<std::mutex> lock(mu_);
    ++turn_;
    cv_.notify_all();
  }
  // A client that failed releases the other instead of stranding it.
  void Fail() {
    std::lock_guard<std::mutex> lock(mu_);
    failed_ = true;
    cv_.notify_all();
  }

 private:
  std::mutex mu_;
  std::condition_variable cv_;
  int turn_ = 0;
  bool failed_ = false;
};

// Two clients' steps open at once: both headers admitted before either sends
// a layer, layers interleaved one by one (dense with a candidate set, MXFP4
// at r = 4, block), both committed (the second opener first), every reply
// checked against that client's shadow, then a plain step each.
TEST(OverlapTest, TwoClientsStepsOpenAtOnceInterleaveAndCommit) {
  Daemon d(MakeConfig({{.format = "fp8", .num_layers = 3, .pages = 256, .cand_block = 4,
                        .cand_topk_blocks = 4},
                       {.format = "mxfp4", .compress_ratio = 4, .num_layers = 2, .pages = 256},
                       {.format = "mxfp4", .page_entries = 16, .num_layers = 1, .heads = 2,
                        .pages = 256, .block_topk = 3}}));
  std::unique_ptr<IndexerClient> second = d.NewClient();
  ASSERT_NE(second, nullptr);
  IndexerClient* clients[2] = {&d.client(), second.get()};
  Shadow shadows[2] = {Shadow(d.layers(), 31), Shadow(d.layers(), 32)};
  // Committed history first, so the overlapping steps decode and create.
  WireStep(d, shadows[0], {{"x", 70}}, Form::kFloat, clients[0]);
  WireStep(d, shadows[1], {{"y", 45}}, Form::kNative, clients[1]);
  const std::vector<GroupUsage> before = d.engine().Usage();

  const std::vector<SeqStep> seqs[2] = {{{"x", 1}, {"x2", 33}}, {{"y2", 20}, {"y", 2}}};
  const Form forms[2] = {Form::kNative, Form::kFloat};
  const int num_layers = static_cast<int>(d.layers().size());
  std::barrier opened(2);
  Turns turns;
  std::atomic<bool> both_open{false};
  int32_t committed_len[2][2] = {};

  auto run = [&](int c) {
    bool ok = false;
    auto finish = [&] {
      if (!ok) turns.Fail();
    };
    auto step = clients[c]->OpenStep(Header(seqs[c], shadows[c]));
    opened.arrive_and_wait();
    if (!step.ok()) {
      ADD_FAILURE() << "client " << c << ": " << step.status();
      return finish();
    }
    // Admission happens on the daemon when it reads the header.
    if (!PollUntil([&] { return d.engine().open_steps() == 2; })) {
      ADD_FAILURE() << "client " << c << ": the two steps were never open together";
      return finish();
    }
    both_open = true;
    std::vector<LayerData> data = shadows[c].Make(seqs[c]);
    for (int li = 0; li < num_layers; ++li) {
      if (!turns.Wait(2 * li + c)) return finish();
      // Still both open: the other step has not committed in between.
      EXPECT_EQ(d.engine().open_steps(), 2) << "client " << c << " layer " << li;
      const TestLayer& t = d.layers()[li];
      auto reply = (*step)->RunLayer(Request(t, data[li], forms[c]));
      if (!reply.ok()) {
        ADD_FAILURE() << "client " << c << " layer " << li << ": " << reply.status();
        return finish();
      }
      std::vector<int64_t> shape = {data[li].rows, t.topk};
      if (t.role == Role::kBlock) shape = {t.num_heads, data[li].rows, t.topk};
      auto topk = client::ReadInt32Tensor(reply->topk(), shape, "topk");
      if (!topk.ok()) {
        ADD_FAILURE() << topk.status();
        return finish();
      }
      shadows[c].Check(li, seqs[c], data[li], topk->data());
      turns.Next();
    }
    // Commits: client 1 at turn 2 L, client 0 after it.
    if (!turns.Wait(2 * num_layers + (1 - c))) return finish();
    auto committed = (*step)->Commit();
    if (!committed.ok()) {
      ADD_FAILURE() << "client " << c << " commit: " << committed.status();
      return finish();
    }
    shadows[c].Commit(seqs[c], data);
    for (int i = 0; i < 2 && i < committed->seq_lens_size(); ++i) {
      committed_len[c][i] = static_cast<int32_t>(committed->seq_lens(i));
    }
    ok = true;
    turns.Next();
  };
  std::thread a(run, 0), b(run, 1);
  a.join();
  b.join();
  EXPECT_TRUE(both_open);
  EXPECT_EQ(committed_len[0][0], 71);
  EXPECT_EQ(committed_len[0][1], 33);
  EXPECT_EQ(committed_len[1][0], 20);
  EXPECT_EQ(committed_len[1][1], 47);
  d.WaitIdle();
  EXPECT_TRUE(d.engine().CheckInvariants().ok()) << d.engine().CheckInvariants();
  const std::vector<GroupUsage> after = d.engine().Usage();
  for (size_t g = 0; g < after.size(); ++g) EXPECT_LE(after[g].free_pages, before[g].free_pages);
  // Both caches hold what each client committed: the next steps check it.
  WireStep(d, shadows[0], {{"x", 1}, {"x2", 1}}, Form::kFloat, clients[0]);
  WireStep(d, shadows[1], {{"y", 1}, {"y2", 1}}, Form::kNative, clients[1]);
}

// -------------------------------------------------- shutdown with work in --

// A one-shot gate in front of the cpu backend: the first layer (RunLayer) or
// entry write (WriteEntries, the import path) after Arm() blocks until
// Open(), telling the test it is inside.
class GatedBackend : public ForwardingBackend {
 public:
  enum class Where { kNone, kLayer, kWrite };
  GatedBackend() : ForwardingBackend(std::make_unique<CpuBackend>(2)) {}

  void Arm(Where w) {
    std::lock_guard<std::mutex> lock(mu_);
    armed_ = w;
  }
  bool WaitEntered() {
    std::unique_lock<std::mutex> lock(mu_);
    return cv_.wait_until(lock, Clock::now() + kDeadline, [&] { return entered_; });
  }
  void Open() {
    std::lock_guard<std::mutex> lock(mu_);
    open_ = true;
    cv_.notify_all();
  }

  std::string Describe() const override { return "gated " + ForwardingBackend::Describe(); }
  absl::StatusOr<double> WriteEntries(const PageLayout& layout, PoolHandle pool,
                                      const StepRows& rows, StepContext* ctx,
                                      const KInput& k) override {
    Pass(Where::kWrite);
    return ForwardingBackend::WriteEntries(layout, pool, rows, ctx, k);
  }
  absl::StatusOr<LayerTimings> RunLayer(PoolHandle pool, StepContext* ctx,
                                        const LayerWork& work) override {
    Pass(Where::kLayer);
    return ForwardingBackend::RunLayer(pool, ctx, work);
  }

 private:
  void Pass(Where here) {
    std::unique_lock<std::mutex> lock(mu_);
    if (armed_ != here) return;
    armed_ = Where::kNone;
    entered_ = true;
    cv_.notify_all();
    cv_.wait(lock, [&] { return open_; });
  }

  std::mutex mu_;
  std::condition_variable cv_;
  Where armed_ = Where::kNone;
  bool entered_ = false;
  bool open_ = false;
};

// The daemon of wire_harness.h's Daemon over a GatedBackend.
struct GatedDaemon {
  explicit GatedDaemon(const config::ServerConfig& cfg) {
    auto model = BuildModel(cfg);
    EXPECT_TRUE(model.ok()) << model.status();
    layers = TestLayers(*model);
    auto b = std::make_unique<GatedBackend>();
    gate = b.get();
    auto engine = Engine::Create(*std::move(model), std::move(b));
    EXPECT_TRUE(engine.ok()) << engine.status();
    auto s = StartServer(*std::move(engine), "127.0.0.1:0");
    EXPECT_TRUE(s.ok()) << s.status();
    server = *std::move(s);
    auto c = IndexerClient::Connect("127.0.0.1:" + std::to_string(server->port()));
    EXPECT_TRUE(c.ok()) << c.status();
    client = *std::move(c);
  }
  Engine& engine() { return server->engine(); }

  std::vector<TestLayer> layers;
  GatedBackend* gate = nullptr;
  std::unique_ptr<RunningServer> server;
  std::unique_ptr<IndexerClient> client;
};

// True once the daemon refuses new calls, i.e. RunningServer::Shutdown has
// reached the gRPC server's Shutdown: a health check on a fresh channel.
bool Refusing(int port) {
  grpc::GenericStub stub(grpc::CreateChannel("127.0.0.1:" + std::to_string(port),
                                             grpc::InsecureChannelCredentials()));
  grpc::ClientContext ctx;
  ctx.set_deadline(std::chrono::system_clock::now() + std::chrono::seconds(2));
  grpc::Slice empty("");
  grpc::ByteBuffer request(&empty, 1), response;
  std::mutex mu;
  std::condition_variable cv;
  bool done = false;
  grpc::Status status;
  stub.UnaryCall(&ctx, "/grpc.health.v1.Health/Check", grpc::StubOptions(), &request, &response,
                 [&](grpc::Status s) {
                   std::lock_guard<std::mutex> lock(mu);
                   status = s;
                   done = true;
                   cv.notify_one();
                 });
  std::unique_lock<std::mutex> lock(mu);
  cv.wait(lock, [&] { return done; });
  return !status.ok();
}

// Runs RunningServer::Shutdown(grace_ms) on its own thread once the gate is
// entered, opens the gate when the daemon refuses new calls (so the work is
// in the backend across the shutdown), and waits for Shutdown to return.
void ShutdownWhileGated(GatedDaemon& d, int grace_ms) {
  ASSERT_TRUE(d.gate->WaitEntered()) << "the work never reached the backend";
  const int port = d.server->port();
  std::mutex mu;
  std::condition_variable cv;
  bool returned = false;
  std::thread shutdown([&] {
    d.server->Shutdown(grace_ms);
    std::lock_guard<std::mutex> lock(mu);
    returned = true;
    cv.notify_all();
  });
  const bool refusing = PollUntil([&] { return Refusing(port); });
  d.gate->Open();
  std::unique_lock<std::mutex> lock(mu);
  if (!cv.wait_until(lock, Clock::now() + kDeadline, [&] { return returned; })) {
    std::fprintf(stderr, "RunningServer::Shutdown did not return\n");
    std::abort();  // the thread cannot be joined
  }
  lock.unlock();
  shutdown.join();
  EXPECT_TRUE(refusing) << "the daemon kept accepting calls during Shutdown";
}

// A step whose second layer is inside the backend when Shutdown runs: the
// step is rolled back (its new sequence gone, the old one at its committed
// length, every page it took free again) and Shutdown returns. With grace 0
// the stream is cancelled while the layer is still running; with 50 ms the
// layer ends inside the grace period and the open step is cancelled after.
void LayerInFlightRollsBack(int grace_ms) {
  GatedDaemon d(MakeConfig({{.format = "fp8", .num_layers = 2, .pages = 64},
                            {.format = "mxfp4", .compress_ratio = 4, .num_layers = 1,
                             .pages = 64}}));
  Shadow shadow(d.layers, 23);
  // Committed history: one plain step.
  {
    const std::vector<SeqStep> seqs = {{"s", 40}};
    auto step = d.client->OpenStep(Header(seqs, shadow));
    ASSERT_TRUE(step.ok()) << step.status();
    std::vector<LayerData> data = shadow.Make(seqs);
    for (size_t li = 0; li < d.layers.size(); ++li) {
      ASSERT_TRUE((*step)->RunLayer(Request(d.layers[li], data[li], Form::kFloat)).ok());
    }
    ASSERT_TRUE((*step)->Commit().ok());
    shadow.Commit(seqs, data);
  }
  const std::vector<GroupUsage> before = d.engine().Usage();

  const std::vector<SeqStep> seqs = {{"s", 1}, {"t", 70}};
  auto step = d.client->OpenStep(Header(seqs, shadow));
  ASSERT_TRUE(step.ok()) << step.status();
  std::vector<LayerData> data = shadow.Make(seqs);
  ASSERT_TRUE((*step)->RunLayer(Request(d.layers[0], data[0], Form::kFloat)).ok());
  d.gate->Arm(GatedBackend::Where::kLayer);
  std::mutex mu;
  std::condition_variable cv;
  bool shut = false;
  absl::Status layer1, after;
  std::thread sender([&] {
    layer1 = (*step)->RunLayer(Request(d.layers[1], data[1], Form::kFloat)).status();
    // Nothing more until Shutdown returned, so that no commit slips into
    // the grace period.
    std::unique_lock<std::mutex> lock(mu);
    cv.wait(lock, [&] { return shut; });
    after = (*step)->Commit().status();
  });
  ShutdownWhileGated(d, grace_ms);
  {
    std::lock_guard<std::mutex> lock(mu);
    shut = true;
    cv.notify_all();
  }
  sender.join();
  EXPECT_FALSE(after.ok()) << "a commit after Shutdown succeeded";
  EXPECT_EQ(d.engine().open_steps(), 0);
  EXPECT_EQ(*d.engine().SequenceLength(SeqName::Named("s")), 40);
  EXPECT_FALSE(d.engine().SequenceLength(SeqName::Named("t")).ok());
  const std::vector<GroupUsage> now = d.engine().Usage();
  for (size_t g = 0; g < now.size(); ++g) EXPECT_EQ(now[g].free_pages, before[g].free_pages);
  EXPECT_TRUE(d.engine().CheckInvariants().ok()) << d.engine().CheckInvariants();
  std::printf("[  layer  ] in flight across Shutdown(%d): %s\n", grace_ms,
              layer1.ToString().c_str());
}

TEST(ShutdownTest, LayerInFlightNoGrace) { LayerInFlightRollsBack(0); }
TEST(ShutdownTest, LayerInFlightWithGrace) { LayerInFlightRollsBack(50); }

// An import whose entries are being written when Shutdown runs: it either
// completes whole (and the client, if answered OK, finds it) or leaves
// nothing; no page leaks, no open step remains, Shutdown returns.
TEST(ShutdownTest, ImportInFlightIsAllOrNothing) {
  GatedDaemon d(MakeConfig({{.format = "fp8", .num_layers = 2, .pages = 64},
                            {.format = "mxfp4", .compress_ratio = 4, .num_layers = 1,
                             .pages = 64}}));
  Shadow shadow(d.layers, 29);
  const std::vector<GroupUsage> before = d.engine().Usage();
  const std::vector<SeqStep> seqs = {{"imp", 90}};
  std::vector<LayerData> data = shadow.MakeEntries(seqs);
  v1::WriteEntriesRequest w;
  *w.mutable_id() = client::NamedSequenceId("imp");
  w.set_create(true);
  w.set_num_tokens(90);
  for (size_t li = 0; li < d.layers.size(); ++li) {
    const TestLayer& t = d.layers[li];
    v1::LayerEntries* le = w.add_layers();
    le->set_layer(static_cast<uint32_t>(t.layer));
    *le->mutable_k() = client::MakeByteTensor(v1::UINT8, data[li].k_quant,
                                              {data[li].n_new, t.layout.entry_bytes()});
  }
  d.gate->Arm(GatedBackend::Where::kWrite);
  absl::StatusOr<uint64_t> len = absl::UnknownError("not sent");
  std::thread sender([&] { len = d.client->WriteEntries(w); });
  ShutdownWhileGated(d, /*grace_ms=*/50);
  sender.join();
  EXPECT_EQ(d.engine().open_steps(), 0);
  EXPECT_TRUE(d.engine().CheckInvariants().ok()) << d.engine().CheckInvariants();
  auto held = d.engine().SequenceLength(SeqName::Named("imp"));
  if (len.ok()) {
    EXPECT_EQ(*len, 90u);
    ASSERT_TRUE(held.ok()) << "answered OK but the sequence is gone";
  }
  const std::vector<GroupUsage> now = d.engine().Usage();
  if (held.ok()) {
    EXPECT_EQ(*held, 90);
    // 90 entries in 16-entry pages (6), 23 MXFP4 entries at r = 4 (2).
    EXPECT_EQ(now[0].free_pages, before[0].free_pages - 6);
    EXPECT_EQ(now[1].free_pages, before[1].free_pages - 2);
  } else {
    for (size_t g = 0; g < now.size(); ++g) EXPECT_EQ(now[g].free_pages, before[g].free_pages);
  }
  std::printf("[  import ] across Shutdown: %s, sequence %s\n", len.status().ToString().c_str(),
              held.ok() ? "kept" : "absent");
}

}  // namespace
}  // namespace indexer::testing

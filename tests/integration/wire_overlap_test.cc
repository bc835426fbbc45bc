// Steps forced to overlap: two clients' steps both open with their layers
// interleaved. Ordering is made by events (a barrier, turns), never by
// sleeps.
#include <atomic>
#include <barrier>
#include <chrono>
#include <condition_variable>
#include <memory>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include "gtest/gtest.h"
#include "indexer/client.h"
#include "tests/integration/test_config.h"
#include "tests/integration/wire_harness.h"

namespace indexer::testing {
namespace {

using Clock = std::chrono::steady_clock;
constexpr auto kDeadline = std::chrono::seconds(30);

// Polls `done` until it holds or kDeadline passes (conditions owned by the
// daemon, which has no event to wait on).
template <typename F>
bool PollUntil(F done) {
  const auto end = Clock::now() + kDeadline;
  while (!done()) {
    if (Clock::now() > end) return false;
    std::this_thread::yield();
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

}  // namespace
}  // namespace indexer::testing

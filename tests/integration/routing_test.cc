// Several daemons behind one client (issue 13 item 3): rendezvous hashing
// moves only the sequences a new daemon wins (~1/n), and a batch spread
// over three cpu-backend daemons on loopback runs as one step per daemon,
// in parallel, each atomic on its own.
#include <algorithm>
#include <map>
#include <string>
#include <vector>

#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "indexer/routing.h"
#include "tests/integration/wire_harness.h"

namespace indexer::testing {
namespace {

using client::PickDaemon;
using client::RoutedClient;

v1::SequenceId Named(const std::string& s) { return client::NamedSequenceId(s); }

TEST(RoutingTest, AddingADaemonMovesAboutOneNthAndOnlyToIt) {
  std::vector<std::string> three = {"indexer-0.indexer:50061", "indexer-1.indexer:50061",
                                    "indexer-2.indexer:50061"};
  std::vector<std::string> four = three;
  four.push_back("indexer-3.indexer:50061");
  const int n = 20000;
  int moved = 0;
  std::vector<int> load(4, 0);
  for (int i = 0; i < n; ++i) {
    const v1::SequenceId id = i % 2 ? Named("chat-" + std::to_string(i))
                                    : client::NumericSequenceId(static_cast<uint64_t>(i) * 7919);
    const size_t before = PickDaemon(three, id), after = PickDaemon(four, id);
    ++load[after];
    if (before != after) {
      ++moved;
      EXPECT_EQ(after, 3u) << "a sequence moved between two old daemons";
    }
  }
  // Expected n/4; the bounds are ~10 standard deviations wide.
  EXPECT_GT(moved, n / 4 - 600);
  EXPECT_LT(moved, n / 4 + 600);
  for (int l : load) EXPECT_NEAR(l, n / 4, 600);
  // Removing a daemon moves only its own sequences.
  for (int i = 0; i < 2000; ++i) {
    const v1::SequenceId id = Named("s" + std::to_string(i));
    const size_t with = PickDaemon(four, id);
    if (with != 3) EXPECT_EQ(PickDaemon(three, id), with);
  }
}

// The same vectors as client/python/tests/test_routing.py: both clients
// route an id to the same daemon.
TEST(RoutingTest, MatchesThePythonClient) {
  const std::vector<std::string> d = {"10.0.0.1:50061", "10.0.0.2:50061", "10.0.0.3:50061"};
  std::vector<size_t> got;
  for (int i = 0; i < 12; ++i) got.push_back(PickDaemon(d, Named("seq-" + std::to_string(i))));
  for (uint64_t i = 0; i < 4; ++i) got.push_back(PickDaemon(d, client::NumericSequenceId(i)));
  EXPECT_EQ(got, (std::vector<size_t>{0, 2, 2, 0, 0, 0, 2, 1, 0, 1, 0, 2, 0, 2, 1, 2}));
}

TEST(RoutingTest, ConnectRefusesEmptyAndRepeatedAddresses) {
  EXPECT_EQ(RoutedClient::Connect({}).status().code(), absl::StatusCode::kInvalidArgument);
  auto twice = RoutedClient::Connect({"127.0.0.1:1", "127.0.0.1:1"});
  EXPECT_EQ(twice.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(std::string(twice.status().message()), ::testing::HasSubstr("addresses[1]"));
}

class ThreeDaemons : public ::testing::Test {
 protected:
  ThreeDaemons() {
    for (int i = 0; i < 3; ++i) {
      daemons_.push_back(std::make_unique<Daemon>(
          MakeConfig({{.format = "fp8", .num_layers = 2, .pages = 128},
                      {.format = "mxfp4", .compress_ratio = 4, .num_layers = 1, .pages = 64}})));
      addresses_.push_back("127.0.0.1:" + std::to_string(daemons_.back()->port()));
    }
    auto rc = RoutedClient::Connect(addresses_);
    EXPECT_TRUE(rc.ok()) << rc.status();
    routed_ = *std::move(rc);
  }

  const std::vector<TestLayer>& layers() const { return daemons_[0]->layers(); }

  // Names that give every daemon `per_daemon` sequences (the daemons'
  // ports, and so the routing, change from run to run), `q_len` tokens each.
  std::vector<SeqStep> Spread(const std::string& prefix, int per_daemon, int64_t q_len) {
    std::vector<SeqStep> out;
    std::vector<int> count(3, 0);
    for (int i = 0; *std::min_element(count.begin(), count.end()) < per_daemon; ++i) {
      const std::string s = prefix + std::to_string(i);
      const size_t d = routed_->DaemonFor(Named(s));
      if (count[d] < per_daemon) {
        out.push_back({s, q_len + static_cast<int64_t>(out.size())});
        ++count[d];
      }
    }
    return out;
  }

  // A routed step over `seqs` (create when the shadow has not seen one):
  // every part's top-k checked against the shadow, committed parts recorded.
  std::vector<RoutedClient::Part> RoutedStep(const std::vector<SeqStep>& seqs,
                                             const std::vector<bool>& force_create = {}) {
    v1::StepHeader batch = Header(seqs, shadow_);
    for (size_t i = 0; i < force_create.size(); ++i) {
      if (force_create[i]) batch.mutable_sequences(static_cast<int>(i))->set_create(true);
    }
    // Inputs per daemon, made up front (the builder runs on the parts' threads).
    std::map<size_t, std::vector<SeqStep>> sub;
    for (const SeqStep& s : seqs) sub[routed_->DaemonFor(Named(s.first))].push_back(s);
    std::map<size_t, std::vector<LayerData>> data;
    for (const auto& [d, ss] : sub) data[d] = shadow_.Make(ss);
    std::vector<uint32_t> layer_ids;
    for (const TestLayer& t : layers()) layer_ids.push_back(static_cast<uint32_t>(t.layer));
    auto parts = routed_->Step(batch, layer_ids,
                               [&](size_t d, const std::vector<size_t>& idx, uint32_t layer) {
                                 EXPECT_EQ(idx.size(), sub.at(d).size());
                                 return absl::StatusOr<v1::LayerRequest>(
                                     Request(layers()[layer], data.at(d)[layer], Form::kFloat));
                               });
    for (const RoutedClient::Part& p : parts) {
      if (!p.status.ok()) continue;
      EXPECT_EQ(p.replies.size(), layers().size());
      for (size_t li = 0; li < p.replies.size(); ++li) {
        auto topk = client::ReadInt32Tensor(p.replies[li].topk(),
                                            {data[p.daemon][li].rows, layers()[li].topk});
        EXPECT_TRUE(topk.ok()) << topk.status();
        if (topk.ok()) shadow_.Check(li, sub[p.daemon], data[p.daemon][li], topk->data());
      }
      shadow_.Commit(sub[p.daemon], data[p.daemon]);
      for (size_t k = 0; k < p.sequences.size(); ++k) {
        EXPECT_EQ(p.committed.seq_lens(static_cast<int>(k)),
                  static_cast<uint64_t>(shadow_.len(seqs[p.sequences[k]].first)));
      }
    }
    return parts;
  }

  std::vector<std::unique_ptr<Daemon>> daemons_;
  std::vector<std::string> addresses_;
  std::unique_ptr<RoutedClient> routed_;
  Shadow shadow_{MakeLayersOnce(), 21};

 private:
  static std::vector<TestLayer> MakeLayersOnce() {
    auto m = BuildModel(MakeConfig({{.format = "fp8", .num_layers = 2, .pages = 128},
                                    {.format = "mxfp4", .compress_ratio = 4, .num_layers = 1,
                                     .pages = 64}}));
    return TestLayers(*m);
  }
};

TEST_F(ThreeDaemons, BatchSpreadOverDaemonsOneStepEach) {
  const std::vector<SeqStep> prefill = Spread("s", 4, 20);
  auto parts = RoutedStep(prefill);
  ASSERT_EQ(parts.size(), 3u);
  for (const auto& p : parts) EXPECT_TRUE(p.status.ok()) << p.status;
  // Each daemon holds exactly the sequences routed to it.
  for (size_t d = 0; d < 3; ++d) {
    int64_t mine = 0;
    for (const auto& [s, q] : prefill) {
      const bool here = routed_->DaemonFor(Named(s)) == d;
      mine += here;
      EXPECT_EQ(daemons_[d]->engine().SequenceLength(SeqName::Named(s)).ok(), here) << s;
    }
    EXPECT_EQ(daemons_[d]->engine().num_sequences(), mine);
  }
  std::vector<SeqStep> decode;
  for (const auto& [s, q] : prefill) decode.push_back({s, 1});
  for (int step = 0; step < 2; ++step) {
    for (const auto& p : RoutedStep(decode)) EXPECT_TRUE(p.status.ok()) << p.status;
  }
  std::vector<v1::SequenceId> ids;
  for (const auto& [s, q] : decode) ids.push_back(Named(s));
  auto released = routed_->Release(ids);
  ASSERT_TRUE(released.ok()) << released.status();
  EXPECT_GT(*released, 0u);
  for (auto& d : daemons_) EXPECT_EQ(d->engine().num_sequences(), 0);
}

// One daemon's part fails (a sequence "created" twice there): that part
// rolls back, the other daemons' parts commit.
TEST_F(ThreeDaemons, AtomicPerDaemonOnly) {
  std::vector<SeqStep> prefill = Spread("a", 3, 16);
  for (auto& s : prefill) s.second = 16;
  for (const auto& p : RoutedStep(prefill)) ASSERT_TRUE(p.status.ok()) << p.status;
  const size_t victim = routed_->DaemonFor(Named(prefill[0].first));
  std::vector<SeqStep> decode;
  for (const auto& [s, q] : prefill) decode.push_back({s, 1});
  std::vector<bool> force(decode.size(), false);
  force[0] = true;  // it exists: AlreadyExists on its daemon
  auto parts = RoutedStep(decode, force);
  ASSERT_EQ(parts.size(), 3u);
  int ok = 0;
  for (const auto& p : parts) {
    if (p.daemon == victim) {
      EXPECT_EQ(p.status.code(), absl::StatusCode::kAlreadyExists) << p.status;
      EXPECT_THAT(std::string(p.status.message()), ::testing::HasSubstr(addresses_[victim]));
    } else {
      EXPECT_TRUE(p.status.ok()) << p.status;
      ++ok;
    }
  }
  EXPECT_EQ(ok, 2);
  for (const auto& [s, q] : prefill) {
    const size_t d = routed_->DaemonFor(Named(s));
    EXPECT_EQ(*daemons_[d]->engine().SequenceLength(SeqName::Named(s)), d == victim ? 16 : 17)
        << s;
  }
  for (auto& d : daemons_) EXPECT_TRUE(d->engine().CheckInvariants().ok());
}

}  // namespace
}  // namespace indexer::testing

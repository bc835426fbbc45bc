// End to end, the way serving engines drive the daemon: committed steps of
// up to max_batch sequences, contexts beyond 64k tokens, imports and
// releases between steps, several clients at once. Every layer's top-k is
// checked against the reference (shadow.h) and every commit's lengths.
//
// The commit reply (StepCommitted) is a packed varint list: its lengths
// cross every varint width here (1, 2 and 3 bytes per length; a 1- and a
// 2-byte message length), which a 20-sequence commit used to crash on.
#include <atomic>
#include <string>
#include <thread>
#include <vector>

#include "gtest/gtest.h"
#include "tests/integration/wire_harness.h"

namespace indexer::testing {
namespace {

// One FP8 group, r = 4 (131,072 tokens are 32,768 entries), 64-entry pages.
config::ServerConfig ServingConfig(int pages) {
  config::ServerConfig cfg = MakeConfig({{.format = "fp8", .page_entries = 64,
                                          .compress_ratio = 4, .num_layers = 1, .heads = 4,
                                          .topk = 32, .pages = pages}});
  cfg.set_max_q_len(65536);
  cfg.set_max_seq_len(262144);
  cfg.set_max_batch(1024);
  return cfg;
}

struct BatchCase {
  int batch;
  bool long_context;  // sequence 0 grows to 131,073 tokens (3-byte varint)
};

class CommitBatch : public ::testing::TestWithParam<BatchCase> {};

// Create `batch` sequences in one committed step, grow some by import
// (to 2- and 3-byte lengths), decode every sequence in one committed step,
// release half of them and decode the rest again.
TEST_P(CommitBatch, CommitsEveryVarintWidth) {
  const BatchCase c = GetParam();
  Daemon d(ServingConfig(/*pages=*/c.batch + 1200));
  const std::vector<GroupUsage> empty = d.engine().Usage();
  Shadow shadow(d.layers(), 1000 + c.batch);
  std::vector<SeqStep> create, decode;
  for (int i = 0; i < c.batch; ++i) {
    create.push_back({SeqNameOf("s", i), 1});
    decode.push_back({SeqNameOf("s", i), 1});
  }
  WireStep(d, shadow, create, Form::kNative);
  if (c.long_context) Import(d, shadow, d.client(), "s0", 131072, 65536);
  if (c.batch > 1) Import(d, shadow, d.client(), "s1", 300, 65536);
  WireStep(d, shadow, decode, Form::kNative);
  if (c.long_context) EXPECT_EQ(*d.engine().SequenceLength(SeqName::Named("s0")), 131074);

  // Release every other sequence; the rest keep decoding.
  std::vector<v1::SequenceId> ids;
  std::vector<SeqStep> rest;
  for (int i = 0; i < c.batch; ++i) {
    if (i % 2 == 1) {
      ids.push_back(client::NamedSequenceId(SeqNameOf("s", i)));
      shadow.Forget(SeqNameOf("s", i));
    } else {
      rest.push_back({SeqNameOf("s", i), 1});
    }
  }
  if (!ids.empty()) {
    auto freed = d.client().Release(ids);
    ASSERT_TRUE(freed.ok()) << freed.status();
    EXPECT_GT(*freed, 0u);
  }
  WireStep(d, shadow, rest, Form::kFloat);

  // Everything released: every page is free again.
  ids.clear();
  for (const auto& [name, q] : rest) ids.push_back(client::NamedSequenceId(name));
  ASSERT_TRUE(d.client().Release(ids).ok());
  EXPECT_EQ(d.engine().num_sequences(), 0);
  EXPECT_EQ(d.engine().Usage()[0].free_pages, empty[0].free_pages);
  EXPECT_TRUE(d.engine().CheckInvariants().ok()) << d.engine().CheckInvariants();
}

INSTANTIATE_TEST_SUITE_P(
    Batches, CommitBatch,
    ::testing::Values(BatchCase{1, true}, BatchCase{7, false}, BatchCase{20, false},
                      BatchCase{64, true}, BatchCase{128, false}, BatchCase{1024, true}),
    [](const ::testing::TestParamInfo<BatchCase>& i) {
      return "B" + std::to_string(i.param.batch) + (i.param.long_context ? "_128k" : "");
    });

// Four front-ends at once, each over its own sequences and its own channel:
// prefill of 24 sequences, committed decode steps, imports, releases and new
// sequences in mixed steps. Every top-k checked; nothing leaks.
TEST(ServingTest, SeveralClientsCommitWithImportsAndReleases) {
  config::ServerConfig cfg =
      MakeConfig({{.format = "fp8", .page_entries = 16, .num_layers = 2, .heads = 8,
                   .topk = 16, .pages = 1200},
                  {.format = "mxfp4", .page_entries = 16, .compress_ratio = 4, .tiled = true,
                   .num_layers = 1, .heads = 8, .topk = 16, .pages = 600}},
                 /*next_n=*/2);
  Daemon d(cfg);
  const std::vector<GroupUsage> empty = d.engine().Usage();
  constexpr int kClients = 4, kSeqs = 24;
  std::atomic<int> failures{0};
  std::vector<std::thread> threads;
  for (int c = 0; c < kClients; ++c) {
    threads.emplace_back([&, c] {
      std::unique_ptr<IndexerClient> client = d.NewClient();
      Shadow shadow(d.layers(), 77 + c);
      const std::string p = "c" + std::to_string(c) + "-";
      std::vector<SeqStep> prefill, decode;
      for (int i = 0; i < kSeqs; ++i) {
        prefill.push_back({SeqNameOf(p, i), 1 + (i * 37 + c * 11) % 90});
        decode.push_back({SeqNameOf(p, i), 1 + i % 2});
      }
      WireStep(d, shadow, prefill, Form::kFloat, client.get());
      for (int step = 0; step < 4; ++step) {
        WireStep(d, shadow, decode, step % 2 ? Form::kFloat : Form::kNative, client.get());
        if (step == 1) Import(d, shadow, *client, SeqNameOf(p, 0), 500, 4096);
        if (step == 2) {
          // Release the last four, then bring four new ones in a mixed step.
          std::vector<v1::SequenceId> ids;
          for (int i = kSeqs - 4; i < kSeqs; ++i) {
            ids.push_back(client::NamedSequenceId(SeqNameOf(p, i)));
            shadow.Forget(SeqNameOf(p, i));
          }
          auto freed = client->Release(ids);
          if (!freed.ok()) ++failures;
          for (int i = kSeqs - 4; i < kSeqs; ++i) decode[i].first = SeqNameOf(p + "new", i);
          std::vector<SeqStep> mixed = decode;
          for (int i = kSeqs - 4; i < kSeqs; ++i) mixed[i].second = 40 + i;
          WireStep(d, shadow, mixed, Form::kNative, client.get());
        }
      }
      std::vector<v1::SequenceId> ids;
      for (const auto& [name, q] : decode) ids.push_back(client::NamedSequenceId(name));
      if (!client->Release(ids).ok()) ++failures;
      if (::testing::Test::HasFailure()) ++failures;
    });
  }
  for (std::thread& t : threads) t.join();
  EXPECT_EQ(failures.load(), 0);
  EXPECT_EQ(d.engine().num_sequences(), 0);
  EXPECT_EQ(d.engine().open_steps(), 0);
  const std::vector<GroupUsage> now = d.engine().Usage();
  for (size_t g = 0; g < now.size(); ++g) EXPECT_EQ(now[g].free_pages, empty[g].free_pages);
  EXPECT_TRUE(d.engine().CheckInvariants().ok()) << d.engine().CheckInvariants();
}

}  // namespace
}  // namespace indexer::testing

// Tests of the client-side reference indexer and the top-k checkers.
#include <cmath>
#include <string>
#include <vector>

#include "client/reference.h"
#include "client/workload.h"
#include "gtest/gtest.h"
#include "indexer/client.h"

namespace indexer::client {
namespace {

// ------------------------------------------------------- token arithmetic --

TEST(TokenArithmetic, CompressRatioFour) {
  EXPECT_EQ(EntriesFor(10, 4), 2);
  EXPECT_EQ(NewEntriesFor(10, 3, 4), 1);   // 13/4 - 10/4 = 3 - 2
  EXPECT_EQ(NewEntriesFor(10, 1, 4), 0);
  EXPECT_EQ(NewEntriesFor(0, 1000, 1), 1000);
  EXPECT_EQ(VisibleEntries(0, 4), 0);
  EXPECT_EQ(VisibleEntries(3, 4), 1);
  EXPECT_EQ(VisibleEntries(999, 1), 1000);
}

TEST(ImportChunkTokens, BudgetOverEveryLayerThenMaxQLen) {
  LayerSpec fp8;  // FP8 D 128: 132 bytes an entry
  fp8.compress_ratio = 4;
  LayerSpec mx;
  mx.format = KvFormat::kMxfp4;  // 64 + 4 bytes an entry
  const std::vector<LayerSpec> specs{fp8, fp8, mx};
  // 1 + 2 * (132 / 4 + 1) + (68 + 1) = 138 bytes a token.
  EXPECT_EQ(ImportChunkTokens(specs, 65536, 138 * 1000), 1000);
  EXPECT_EQ(ImportChunkTokens(specs, 65536, 138 * 1000 + 137), 1000);
  EXPECT_EQ(ImportChunkTokens(specs, 500, 138 * 1000), 500);  // max_q_len caps
  EXPECT_EQ(ImportChunkTokens(specs, 65536, 10), 1);          // never 0
}

// ---------------------------------------------------------------- checker --

TEST(CheckTopkRow, AcceptsExactTopkInAnyOrder) {
  const std::vector<float> logits = {0.1f, 5.0f, 3.0f, -1.0f, 4.0f};
  EXPECT_TRUE(CheckTopkRow(logits, std::vector<int32_t>{4, 1, 2}).ok);
}

TEST(CheckTopkRow, ShortRowHoldsAllThenMinusOne) {
  const std::vector<float> logits = {1.0f, 2.0f};
  EXPECT_TRUE(CheckTopkRow(logits, std::vector<int32_t>{1, 0, -1, -1}).ok);
  EXPECT_FALSE(CheckTopkRow(logits, std::vector<int32_t>{1, -1, 0, -1}).ok);
  EXPECT_FALSE(CheckTopkRow(logits, std::vector<int32_t>{1, -1, -1, -1}).ok);
  EXPECT_TRUE(CheckTopkRow({}, std::vector<int32_t>{-1, -1}).ok);
}

TEST(CheckTopkRow, RejectsWrongCountDuplicatesAndRange) {
  const std::vector<float> logits = {0.1f, 5.0f, 3.0f, -1.0f, 4.0f};
  EXPECT_FALSE(CheckTopkRow(logits, std::vector<int32_t>{4, 1, -1}).ok);
  EXPECT_FALSE(CheckTopkRow(logits, std::vector<int32_t>{4, 4, 1}).ok);
  EXPECT_FALSE(CheckTopkRow(logits, std::vector<int32_t>{4, 1, 5}).ok);
  EXPECT_FALSE(CheckTopkRow(logits, std::vector<int32_t>{4, 1, -7}).ok);
}

TEST(CheckTopkRow, RejectsALowScoringIndex) {
  const std::vector<float> logits = {0.1f, 5.0f, 3.0f, -1.0f, 4.0f};
  const RowVerdict v = CheckTopkRow(logits, std::vector<int32_t>{4, 1, 0});
  EXPECT_FALSE(v.ok);
  EXPECT_NE(v.problem.find("entry 0"), std::string::npos) << v.problem;
}

TEST(CheckTopkRow, ANearTieCannotPushOutAClearWinner) {
  const std::vector<float> logits = {100.0f, 5.0f, 5.0f - 1e-5f};
  EXPECT_TRUE(CheckTopkRow(logits, std::vector<int32_t>{0, 2}).ok);
  const RowVerdict v = CheckTopkRow(logits, std::vector<int32_t>{1, 2});
  EXPECT_FALSE(v.ok);
  EXPECT_NE(v.problem.find("missing"), std::string::npos) << v.problem;
}

TEST(CheckTopkRow, TiesWithinToleranceGoEitherWay) {
  // Entries 2 and 3 tie up to fp32 summation noise at the cut.
  const std::vector<float> logits = {9.0f, 8.0f, 3.0f, 3.0f - 1e-5f, 1.0f};
  EXPECT_TRUE(CheckTopkRow(logits, std::vector<int32_t>{0, 1, 3}).ok);
  EXPECT_TRUE(CheckTopkRow(logits, std::vector<int32_t>{0, 1, 2}).ok);
  TopkTolerance strict{0, 0};
  EXPECT_FALSE(CheckTopkRow(logits, std::vector<int32_t>{0, 1, 3}, strict).ok);
}

// ------------------------------------------------------- reply shapes --

LayerSpec ShapeSpec(const char* role, int32_t topk, int32_t heads = 1) {
  LayerSpec spec;
  spec.role = role;
  spec.topk = topk;
  spec.topk_blocks = topk;
  spec.num_heads = heads;
  spec.page_entries = 4;
  return spec;
}

TEST(CheckReplyShape, AcceptsFullAndShortRows) {
  const LayerSpec dense = ShapeSpec(kRoleDense, 3);
  // Row 0 sees 2 entries (both, then -1), row 1 sees 5 (any 3 of them).
  EXPECT_TRUE(CheckReplyShape(dense, std::vector<int64_t>{2, 5},
                              std::vector<int32_t>{1, 0, -1, 4, 0, 2}).ok);
  EXPECT_TRUE(CheckReplyShape(dense, std::vector<int64_t>{0}, std::vector<int32_t>{-1, -1, -1}).ok);
}

TEST(CheckReplyShape, RejectsEachBreach) {
  const LayerSpec dense = ShapeSpec(kRoleDense, 3);
  const std::vector<int64_t> bounds = {2, 5};
  auto problem = [&](std::vector<int32_t> got) { return CheckReplyShape(dense, bounds, got).problem; };
  EXPECT_NE(problem({1, 2, -1, 4, 0, 2}).find("row 0: slot 1 holds 2, expected entry in [0, 2)"),
            std::string::npos);
  EXPECT_NE(problem({1, 0, -1, 4, 4, 2}).find("row 1: entry 4 returned twice"), std::string::npos);
  EXPECT_NE(problem({1, -1, 0, 4, 0, 2}).find("row 0: -1 at slot 1 before the last index"), std::string::npos);
  EXPECT_NE(problem({1, -1, -1, 4, 0, 2}).find("row 0: expected 2 indices (topk 3, visible 2), got 1"),
            std::string::npos);
  EXPECT_NE(problem({1, 0, -1, 4, 0, -1}).find("row 1: expected 3 indices (topk 3, visible 5), got 2"),
            std::string::npos);
  EXPECT_NE(problem({1, 0, -1, 4, 0}).find("reply holds 5 indices, expected 1 x 2 x 3"), std::string::npos);
}

TEST(CheckReplyShape, AConsumerMayReturnFewerButNotNone) {
  const LayerSpec consumer = ShapeSpec(kRoleConsumer, 3);
  const std::vector<int64_t> bounds = {5};
  EXPECT_TRUE(CheckReplyShape(consumer, bounds, std::vector<int32_t>{4, -1, -1}).ok);
  EXPECT_TRUE(CheckReplyShape(consumer, bounds, std::vector<int32_t>{4, 0, 1}).ok);
  EXPECT_FALSE(CheckReplyShape(consumer, bounds, std::vector<int32_t>{-1, -1, -1}).ok);
  EXPECT_TRUE(CheckReplyShape(consumer, std::vector<int64_t>{0}, std::vector<int32_t>{-1, -1, -1}).ok);
}

TEST(CheckReplyShape, BlockLayersCheckEveryHeadsRows) {
  const LayerSpec block = ShapeSpec(kRoleBlock, 2, /*heads=*/2);
  const std::vector<int64_t> bounds = {1, 3};  // causal blocks of rows 0, 1
  EXPECT_TRUE(CheckReplyShape(block, bounds, std::vector<int32_t>{0, -1, 2, 0, 0, -1, 1, 2}).ok);
  const RowVerdict v = CheckReplyShape(block, bounds, std::vector<int32_t>{0, -1, 2, 0, 0, -1, 1, 3});
  EXPECT_NE(v.problem.find("head 1 row 1: slot 1 holds 3, expected block in [0, 3)"), std::string::npos)
      << v.problem;
}

TEST(ReplyRowBounds, VisibleEntriesOrCausalBlocksPerRow) {
  LayerSpec dense = ShapeSpec(kRoleDense, 3);
  dense.compress_ratio = 4;
  // Sequence 0: 7 tokens before, 2 rows (positions 7, 8: 8/4, 9/4 entries);
  // sequence 1: none before, 1 row.
  EXPECT_EQ(ReplyRowBounds(dense, std::vector<int64_t>{7, 0}, std::vector<int64_t>{2, 1}),
            (std::vector<int64_t>{2, 2, 0}));
  const LayerSpec block = ShapeSpec(kRoleBlock, 2);  // 4-entry blocks, r = 1
  EXPECT_EQ(ReplyRowBounds(block, std::vector<int64_t>{3}, std::vector<int64_t>{2}),
            (std::vector<int64_t>{1, 2}));
}

TEST(AgreementReport, CountsAndKeepsProblems) {
  AgreementReport a, b;
  a.Add("row 0", RowVerdict{});
  b.Add("row 1", RowVerdict{false, "bad"});
  a.Merge(b);
  EXPECT_EQ(a.rows(), 2);
  EXPECT_EQ(a.agreeing(), 1);
  EXPECT_FALSE(a.full());
  ASSERT_EQ(a.problems().size(), 1u);
  EXPECT_EQ(a.problems()[0], "row 1: bad");
}

// --------------------------------------------------------------- geometry --

v1::ServerInfo TwoGroupInfo() {
  v1::ServerInfo info;
  v1::LayerGroupInfo* g = info.add_groups();
  g->set_name("fp8");
  g->set_kv_format("fp8");
  g->set_head_dim(128);
  g->set_page_entries(64);
  g->set_compress_ratio(1);
  g->set_ue8m0(true);
  g->set_entry_bytes(132);
  g = info.add_groups();
  g->set_name("mx");
  g->set_kv_format("mxfp4");
  g->set_head_dim(128);
  g->set_page_entries(128);
  g->set_compress_ratio(4);
  g->set_entry_bytes(68);
  for (uint32_t layer : {2u, 0u, 1u}) {
    v1::LayerInfo* l = info.add_layers();
    l->set_layer(layer);
    l->set_group(layer == 2 ? "mx" : "fp8");
    l->set_role("dense");
    l->set_num_heads(64);
    l->set_topk(2048);
  }
  return info;
}

TEST(LayerSpecsFromInfo, JoinsGroupsAndSortsLayers) {
  absl::StatusOr<std::vector<LayerSpec>> specs =
      LayerSpecsFromInfo(TwoGroupInfo());
  ASSERT_TRUE(specs.ok()) << specs.status();
  ASSERT_EQ(specs->size(), 3u);
  EXPECT_EQ((*specs)[0].layer, 0u);
  EXPECT_EQ((*specs)[2].layer, 2u);
  EXPECT_EQ((*specs)[2].format, KvFormat::kMxfp4);
  EXPECT_EQ((*specs)[2].compress_ratio, 4);
  EXPECT_EQ((*specs)[2].entry_bytes(), 68);
  EXPECT_EQ((*specs)[0].entry_bytes(), 132);
}

TEST(LayerSpecsFromInfo, RejectsUnknownGroupAndEntryBytes) {
  v1::ServerInfo info = TwoGroupInfo();
  info.mutable_layers(0)->set_group("nope");
  EXPECT_EQ(LayerSpecsFromInfo(info).status().code(),
            absl::StatusCode::kInvalidArgument);
  info = TwoGroupInfo();
  info.mutable_groups(1)->set_entry_bytes(72);
  EXPECT_EQ(LayerSpecsFromInfo(info).status().code(),
            absl::StatusCode::kInvalidArgument);
}

v1::ServerInfo RoleInfo() {
  v1::ServerInfo info = TwoGroupInfo();
  info.mutable_layers(1)->set_role("candidate_source");   // layer 0
  info.mutable_layers(2)->set_role("candidate_consumer");  // layer 1
  for (int i : {1, 2}) {
    v1::LayerInfo* l = info.mutable_layers(i);
    l->set_candidate_source(0);
    l->set_candidate_block_size(8);
    l->set_candidate_topk_blocks(2048);
    l->set_pin_newest_block(true);
  }
  v1::LayerInfo* b = info.mutable_layers(0);  // layer 2
  b->set_role("block");
  b->set_topk(0);
  b->set_num_heads(4);
  b->set_topk_blocks(16);
  b->set_local_blocks(1);
  b->set_score("max");
  return info;
}

TEST(LayerSpecsFromInfo, ReadsRoleParameters) {
  absl::StatusOr<std::vector<LayerSpec>> specs = LayerSpecsFromInfo(RoleInfo());
  ASSERT_TRUE(specs.ok()) << specs.status();
  const LayerSpec& src = (*specs)[0];
  const LayerSpec& use = (*specs)[1];
  const LayerSpec& blk = (*specs)[2];
  EXPECT_TRUE(src.is_source());
  EXPECT_TRUE(use.is_consumer());
  EXPECT_EQ(use.candidate_source, 0u);
  EXPECT_EQ(use.RoleString(), "consumer of 0 (block 8, pool 2048, pinned) "
                              "top 2048");
  EXPECT_TRUE(blk.is_block());
  EXPECT_EQ(blk.topk, 16);
  EXPECT_FLOAT_EQ(blk.scale, 1.0f / std::sqrt(128.0f));  // 0 = D^-0.5
  EXPECT_EQ(blk.ReplyShape(5), (std::vector<int64_t>{4, 5, 16}));
  EXPECT_EQ(blk.RoleString(), "block top 16 init 0 local 1 score max "
                              "scale 0.0883883");
}

TEST(LayerSpecsFromInfo, RejectsBadRoles) {
  v1::ServerInfo info = RoleInfo();
  info.mutable_layers(1)->set_role("dense");  // the consumer loses its source
  EXPECT_EQ(LayerSpecsFromInfo(info).status().code(),
            absl::StatusCode::kInvalidArgument);
  info = RoleInfo();
  info.mutable_layers(2)->set_candidate_topk_blocks(1024);
  EXPECT_EQ(LayerSpecsFromInfo(info).status().code(),
            absl::StatusCode::kInvalidArgument);
  info = RoleInfo();
  info.mutable_layers(0)->set_topk_blocks(0);
  EXPECT_EQ(LayerSpecsFromInfo(info).status().code(),
            absl::StatusCode::kInvalidArgument);
  info = RoleInfo();
  info.mutable_layers(0)->set_role("sliding");
  EXPECT_EQ(LayerSpecsFromInfo(info).status().code(),
            absl::StatusCode::kUnimplemented);
}

// -------------------------------------------------------------- reference --

// Values exactly representable after quantization in both formats (see the
// scale rules of SPEC §3), so the reference must reproduce the plain
// unquantized formula exactly.
class ReferenceLogits : public ::testing::TestWithParam<KvFormat> {};

TEST_P(ReferenceLogits, MatchesPlainFormulaOnExactValues) {
  LayerSpec spec;
  spec.layer = 7;
  spec.format = GetParam();
  spec.head_dim = 64;
  spec.num_heads = 3;
  spec.topk = 4;
  spec.ue8m0 = true;
  const int d = spec.head_dim, h = spec.num_heads, n = 6, rows = 2;
  const float kv[] = {1.0f, -2.0f, 0.5f, 0.0f};
  const float qv[] = {0.5f, 1.0f, -1.0f, 2.0f};
  std::vector<float> k(n * d), q(rows * h * d), w(rows * h);
  for (int e = 0; e < n; ++e) {
    for (int i = 0; i < d; ++i) k[e * d + i] = kv[(e + i * (e + 1)) % 4];
  }
  for (int rh = 0; rh < rows * h; ++rh) {
    for (int i = 0; i < d; ++i) q[rh * d + i] = qv[(rh * 3 + i) % 4];
    w[rh] = 0.25f * static_cast<float>(rh + 1);
  }

  ReferenceIndexer ref({spec}, 1);
  ASSERT_TRUE(ref.Append(7, 0, QuantizeKEntries(spec, k)).ok());
  ASSERT_EQ(ref.NumEntries(7, 0), n);
  const QuantizedQ qq = QuantizeQ(spec, rows, q, w);
  for (int r = 0; r < rows; ++r) {
    absl::StatusOr<std::vector<float>> logits = ref.Logits(7, 0, qq, r, n);
    ASSERT_TRUE(logits.ok()) << logits.status();
    ASSERT_EQ(logits->size(), static_cast<size_t>(n));
    for (int e = 0; e < n; ++e) {
      double want = 0;
      for (int hh = 0; hh < h; ++hh) {
        double dot = 0;
        for (int i = 0; i < d; ++i) {
          dot += double{q[(r * h + hh) * d + i]} * k[e * d + i];
        }
        want += w[r * h + hh] * std::max(dot, 0.0);
      }
      EXPECT_NEAR((*logits)[e], want, 1e-6 * std::fabs(want))
          << "row " << r << " entry " << e;
    }
  }
  EXPECT_FALSE(ref.Logits(7, 0, qq, 0, n + 1).ok());
}

INSTANTIATE_TEST_SUITE_P(Formats, ReferenceLogits,
                         ::testing::Values(KvFormat::kFp8, KvFormat::kMxfp4));

TEST(QuantizeQ, Fp8FoldsPowerOfTwoScaleIntoWeights) {
  LayerSpec spec;
  spec.format = KvFormat::kFp8;
  spec.head_dim = 32;
  spec.num_heads = 1;
  std::vector<float> q(32, 0.0f), w = {3.0f};
  q[5] = 0.5f;  // smallest pow2 s >= 0.5/448 is 2^-9
  const QuantizedQ qq = QuantizeQ(spec, 1, q, w);
  EXPECT_FLOAT_EQ(qq.weights[0], 3.0f * std::ldexp(1.0f, -9));
  spec.format = KvFormat::kMxfp4;
  const QuantizedQ mx = QuantizeQ(spec, 1, q, w);
  EXPECT_FLOAT_EQ(mx.weights[0], 3.0f);
  EXPECT_EQ(mx.values.size(), 16u);
  EXPECT_EQ(mx.scales.size(), 1u);
}

// -------------------------------------------------------- candidate pools --

TEST(BlockMaxima, PartialLastBlock) {
  const std::vector<float> logits = {1, 5, 2, -3, 4, 0, 7};
  EXPECT_EQ(BlockMaxima(logits, 3), (std::vector<float>{5, 4, 7}));
  EXPECT_TRUE(BlockMaxima({}, 3).empty());
}

TEST(SelectCandidatePool, TopBlocksUnpinned) {
  const std::vector<float> m = {3, 9, 1, 7, 5};
  EXPECT_EQ(SelectCandidatePool(m, 2, false), (std::vector<int32_t>{1, 3}));
}

TEST(SelectCandidatePool, PinnedNewestReplacesTheWeakest) {
  // Newest block 4 is weakest; it takes the place of block 3 (max 7).
  const std::vector<float> m = {3, 9, 1, 7, 0.5f};
  EXPECT_EQ(SelectCandidatePool(m, 2, true), (std::vector<int32_t>{1, 4}));
  EXPECT_EQ(SelectCandidatePool(m, 1, true), (std::vector<int32_t>{4}));
  // Newest already among the top: plain top-k.
  const std::vector<float> n = {3, 9, 1, 7, 8};
  EXPECT_EQ(SelectCandidatePool(n, 2, true), (std::vector<int32_t>{1, 4}));
  EXPECT_EQ(SelectCandidatePool(n, 3, true), (std::vector<int32_t>{1, 3, 4}));
}

TEST(SelectCandidatePool, TiesGoToTheSmallerBlockId) {
  const std::vector<float> m = {2, 5, 5, 5, 1};
  EXPECT_EQ(SelectCandidatePool(m, 2, false), (std::vector<int32_t>{1, 2}));
  EXPECT_EQ(SelectCandidatePool(m, 3, true), (std::vector<int32_t>{1, 2, 4}));
}

TEST(SelectCandidatePool, FewerBlocksThanThePoolTakesAll) {
  const std::vector<float> m = {2, 5, 1};
  EXPECT_EQ(SelectCandidatePool(m, 3, true), (std::vector<int32_t>{0, 1, 2}));
  EXPECT_EQ(SelectCandidatePool(m, 8, false), (std::vector<int32_t>{0, 1, 2}));
  EXPECT_TRUE(SelectCandidatePool({}, 8, true).empty());
}

TEST(BoundCandidatePool, ClearCutIsUnambiguous) {
  const std::vector<float> m = {3, 9, 1, 7, 0.5f};
  for (bool pin : {false, true}) {
    const PoolBounds b = BoundCandidatePool(m, 2, pin, 0.1);
    EXPECT_FALSE(b.ambiguous());
    EXPECT_EQ(b.sure, SelectCandidatePool(m, 2, pin));
  }
  const PoolBounds all = BoundCandidatePool(m, 5, true, 100);
  EXPECT_FALSE(all.ambiguous());
  EXPECT_EQ(all.sure.size(), 5u);
}

TEST(BoundCandidatePool, TiesAndNearTiesAtTheCutAreMaybe) {
  // Pool of 3, newest (4) pinned: two slots for 0..3; 1 is in, 2 and 3 tie.
  const std::vector<float> m = {2, 9, 5, 5, 1};
  PoolBounds b = BoundCandidatePool(m, 3, true, 0);
  EXPECT_EQ(b.sure, (std::vector<int32_t>{1, 4}));
  EXPECT_EQ(b.maybe, (std::vector<int32_t>{2, 3}));
  // Within 2 * slack of the cut counts as a tie too.
  const std::vector<float> near = {2, 9, 5, 5.05f, 1};
  b = BoundCandidatePool(near, 3, true, 0.03);
  EXPECT_EQ(b.sure, (std::vector<int32_t>{1, 4}));
  EXPECT_EQ(b.maybe, (std::vector<int32_t>{2, 3}));
  b = BoundCandidatePool(near, 3, true, 0.01);
  EXPECT_FALSE(b.ambiguous());
  EXPECT_EQ(b.sure, (std::vector<int32_t>{1, 3, 4}));
}

// Block size 2, logits of 9 entries = blocks {0,1} {2,3} {4,5} {6,7} {8}.
const std::vector<float> kConsumerLogits = {1, 8, 2, 3, 9, 0, 4, 7, 6};

TEST(CheckConsumerRow, TopkOfThePoolOnly) {
  const PoolBounds pool{{0, 3, 4}, {}};  // entries 0 1 6 7 8
  EXPECT_TRUE(CheckConsumerRow(kConsumerLogits, pool, 2,
                               std::vector<int32_t>{1, 7, 8}).ok);
  // Entry 4 scores best overall but is outside the pool.
  const RowVerdict v = CheckConsumerRow(kConsumerLogits, pool, 2,
                                        std::vector<int32_t>{1, 7, 4});
  EXPECT_FALSE(v.ok);
  EXPECT_NE(v.problem.find("outside"), std::string::npos) << v.problem;
  // Entry 6 (4) is in the pool but below its 3rd score (6).
  EXPECT_FALSE(CheckConsumerRow(kConsumerLogits, pool, 2,
                                std::vector<int32_t>{1, 7, 6}).ok);
}

TEST(CheckConsumerRow, SmallPoolHoldsAllThenMinusOne) {
  const PoolBounds pool{{1, 4}, {}};  // entries 2 3 8
  EXPECT_TRUE(CheckConsumerRow(kConsumerLogits, pool, 2,
                               std::vector<int32_t>{8, 2, 3, -1}).ok);
  EXPECT_FALSE(CheckConsumerRow(kConsumerLogits, pool, 2,
                                std::vector<int32_t>{8, 2, -1, -1}).ok);
  EXPECT_FALSE(CheckConsumerRow(kConsumerLogits, pool, 2,
                                std::vector<int32_t>{8, 2, 2, -1}).ok);
}

TEST(CheckConsumerRow, AmbiguousPoolAcceptsEitherChoice) {
  // Block 4 pinned; one of blocks 0 and 3 (maxima 8 and 7 "near-tied").
  const PoolBounds pool{{4}, {0, 3}};
  EXPECT_TRUE(CheckConsumerRow(kConsumerLogits, pool, 2,
                               std::vector<int32_t>{1, 8}).ok);
  EXPECT_TRUE(CheckConsumerRow(kConsumerLogits, pool, 2,
                               std::vector<int32_t>{7, 8}).ok);
  EXPECT_FALSE(CheckConsumerRow(kConsumerLogits, pool, 2,
                                std::vector<int32_t>{4, 8}).ok);
  // Sure entries alone bound the count from below.
  EXPECT_FALSE(CheckConsumerRow(kConsumerLogits, pool, 2,
                                std::vector<int32_t>{-1, -1}).ok);
}

TEST(CheckConsumerRow, AmbiguousPoolStillNeedsClearWinners) {
  // Block 2 (entries 4, 5: 9, 0) is surely pooled; one of blocks 0 and 1.
  const PoolBounds pool{{2}, {0, 1}};
  EXPECT_TRUE(CheckConsumerRow(kConsumerLogits, pool, 2,
                               std::vector<int32_t>{4, 1}).ok);
  EXPECT_TRUE(CheckConsumerRow(kConsumerLogits, pool, 2,
                               std::vector<int32_t>{4, 3}).ok);  // 0 not picked
  const RowVerdict v = CheckConsumerRow(kConsumerLogits, pool, 2,
                                        std::vector<int32_t>{1, 0});
  EXPECT_FALSE(v.ok);
  EXPECT_NE(v.problem.find("entry 4 is missing"), std::string::npos)
      << v.problem;
}

// -------------------------------------------------------------- block path --

TEST(ApplyBlockSentinels, InitAndLocalBlocks) {
  std::vector<float> s = {1, 2, 3, 4, 5};
  ApplyBlockSentinels(1, 2, absl::MakeSpan(s));
  EXPECT_EQ(s, (std::vector<float>{kInitBlockScore, 2, 3, kLocalBlockScore,
                                   kLocalBlockScore}));
}

TEST(ApplyBlockSentinels, InitWinsWhereTheyOverlap) {
  std::vector<float> s = {1, 2, 3};
  ApplyBlockSentinels(2, 2, absl::MakeSpan(s));
  EXPECT_EQ(s, (std::vector<float>{kInitBlockScore, kInitBlockScore,
                                   kLocalBlockScore}));
  s = {1, 2};
  ApplyBlockSentinels(4, 1, absl::MakeSpan(s));
  EXPECT_EQ(s, (std::vector<float>{kInitBlockScore, kInitBlockScore}));
  s = {1, 2};
  ApplyBlockSentinels(0, 0, absl::MakeSpan(s));
  EXPECT_EQ(s, (std::vector<float>{1, 2}));
}

TEST(CausalBlocks, CeilOfVisibleOverPage) {
  EXPECT_EQ(CausalBlocks(0, 128), 0);
  EXPECT_EQ(CausalBlocks(1, 128), 1);
  EXPECT_EQ(CausalBlocks(128, 128), 1);
  EXPECT_EQ(CausalBlocks(129, 128), 2);
}

TEST(CheckBlockRow, ForcedBlocksMustBePresent) {
  // Block 0 init, block 3 local; a huge real score must not loosen that.
  const std::vector<float> s = {kInitBlockScore, 5e4f, 4.9999e4f,
                                kLocalBlockScore};
  EXPECT_TRUE(CheckBlockRow(s, std::vector<int32_t>{3, 0, 1}).ok);
  EXPECT_TRUE(CheckBlockRow(s, std::vector<int32_t>{3, 0, 2}).ok);  // near tie
  EXPECT_FALSE(CheckBlockRow(s, std::vector<int32_t>{1, 2, 0}).ok);
  EXPECT_TRUE(CheckBlockRow({kInitBlockScore, 1},
                            std::vector<int32_t>{1, 0, -1}).ok);
}

LayerSpec BlockSpec(KvFormat format) {
  LayerSpec spec;
  spec.layer = 3;
  spec.role = kRoleBlock;
  spec.format = format;
  spec.head_dim = 32;
  spec.page_entries = 2;
  spec.num_heads = 2;
  spec.topk_blocks = spec.topk = 2;
  spec.init_blocks = 0;
  spec.local_blocks = 1;
  spec.scale = 0.5f;
  return spec;
}

TEST(BlockScores, MaxOfScaledDotsOverVisibleEntries) {
  for (KvFormat format : {KvFormat::kMxfp4, KvFormat::kFp8}) {
    const LayerSpec spec = BlockSpec(format);
    const int d = spec.head_dim, n = 5;
    // Entry e is (e - 2) * 1.0 in every element: exact in both formats.
    std::vector<float> k(n * d);
    for (int e = 0; e < n; ++e) {
      for (int i = 0; i < d; ++i) k[e * d + i] = static_cast<float>(e - 2);
    }
    ReferenceIndexer ref({spec}, 1);
    ASSERT_TRUE(ref.Append(3, 0, QuantizeKEntries(spec, k)).ok());
    // Row 0: head 0 all 1, head 1 all -1.
    std::vector<float> q(2 * d, 1.0f);
    for (int i = d; i < 2 * d; ++i) q[i] = -1.0f;
    // Head 0, 4 visible: blocks {0,1} {2,3} -> max(-2,-1)*16, max(0,1)*16;
    // the last (causal) block is local.
    absl::StatusOr<std::vector<float>> s = ref.BlockScores(3, 0, q, 0, 0, 4);
    ASSERT_TRUE(s.ok()) << s.status();
    EXPECT_EQ(*s, (std::vector<float>{-16, kLocalBlockScore}));
    // Head 1, 3 visible: blocks {0,1} {2}: max(2,1)*16 and local.
    s = ref.BlockScores(3, 0, q, 0, 1, 3);
    ASSERT_TRUE(s.ok()) << s.status();
    EXPECT_EQ(*s, (std::vector<float>{32, kLocalBlockScore}));
    // Head 1, 5 visible: blocks {0,1} {2,3} {4}.
    s = ref.BlockScores(3, 0, q, 0, 1, 5);
    ASSERT_TRUE(s.ok()) << s.status();
    EXPECT_EQ(*s, (std::vector<float>{32, 0, kLocalBlockScore}));
    EXPECT_FALSE(ref.BlockScores(3, 0, q, 0, 1, 6).ok());
    EXPECT_FALSE(ref.BlockScores(3, 0, q, 0, 2, 5).ok());
  }
}

TEST(BlockQueries, Bf16RoundsToNearestEvenAndFp8CarriesScales) {
  LayerSpec spec = BlockSpec(KvFormat::kMxfp4);
  std::vector<float> raw(2 * 32, 0.0f);
  raw[0] = 1.0f + 0x1.0p-8f;       // halfway: rounds to even (1.0)
  raw[1] = 1.0f + 3 * 0x1.0p-8f;   // halfway: rounds up to 1 + 2^-6
  v1::LayerRequest request;
  std::vector<float> seen =
      SetBlockQueries(spec, 1, raw, BlockQFormat::kBf16, &request);
  EXPECT_EQ(seen[0], 1.0f);
  EXPECT_EQ(seen[1], 1.0f + 0x1.0p-6f);
  EXPECT_EQ(request.q().dtype(), v1::BF16);
  EXPECT_EQ(request.q().data().size(), 2u * 64);
  EXPECT_FALSE(request.has_weights());
  seen = SetBlockQueries(spec, 1, raw, BlockQFormat::kFp8, &request);
  EXPECT_EQ(request.q().dtype(), v1::FP8_E4M3);
  EXPECT_EQ(request.q_scale().data().size(), 2u * 4);
  EXPECT_NEAR(seen[1], raw[1], 0.07);  // e4m3: 3 mantissa bits
  EXPECT_EQ(ParseBlockQFormat("bf16").value(), BlockQFormat::kBf16);
  EXPECT_FALSE(ParseBlockQFormat("int8").ok());
}

// ---------------------------------------------------------------- helpers --

TEST(Tensors, RoundTripInt32AndShapeErrors) {
  const std::vector<int32_t> values = {1, -1, 7, 9, 0, 3};
  const v1::Tensor t = MakeInt32Tensor(values, {2, 3});
  absl::StatusOr<std::vector<int32_t>> back = ReadInt32Tensor(t, {2, 3});
  ASSERT_TRUE(back.ok()) << back.status();
  EXPECT_EQ(*back, values);
  EXPECT_EQ(ReadInt32Tensor(t, {3, 2}).status().code(),
            absl::StatusCode::kInvalidArgument);
  v1::Tensor bad = t;
  bad.mutable_data()->pop_back();
  EXPECT_EQ(ReadInt32Tensor(bad).status().code(),
            absl::StatusCode::kInvalidArgument);
  bad = t;
  bad.set_dtype(v1::FP32);
  EXPECT_EQ(ReadInt32Tensor(bad).status().code(),
            absl::StatusCode::kInvalidArgument);
}

TEST(Rng, NormalHasRoughlyUnitMoments) {
  Rng rng(7);
  std::vector<float> x(100000);
  rng.FillNormal(absl::MakeSpan(x));
  double sum = 0, sq = 0;
  for (float v : x) {
    sum += v;
    sq += double{v} * v;
  }
  EXPECT_NEAR(sum / x.size(), 0.0, 0.02);
  EXPECT_NEAR(sq / x.size(), 1.0, 0.02);
}

}  // namespace
}  // namespace indexer::client

// Tests of the client-side reference indexer and the top-k checker.
#include <cmath>
#include <vector>

#include "client/reference.h"
#include "client/workload.h"
#include "gtest/gtest.h"
#include "indexer/client.h"

namespace indexer::client {
namespace {

// ------------------------------------------------------- token arithmetic --

TEST(TokenArithmetic, CompressRatioFour) {
  EXPECT_EQ(EntriesForTokens(10, 4), 2);
  EXPECT_EQ(NewEntries(10, 3, 4), 1);   // 13/4 - 10/4 = 3 - 2
  EXPECT_EQ(NewEntries(10, 1, 4), 0);
  EXPECT_EQ(NewEntries(0, 1000, 1), 1000);
  EXPECT_EQ(VisibleEntries(0, 4), 0);
  EXPECT_EQ(VisibleEntries(3, 4), 1);
  EXPECT_EQ(VisibleEntries(999, 1), 1000);
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

TEST(CheckTopkRow, TiesWithinToleranceGoEitherWay) {
  // Entries 2 and 3 tie up to fp32 summation noise at the cut.
  const std::vector<float> logits = {9.0f, 8.0f, 3.0f, 3.0f - 1e-5f, 1.0f};
  EXPECT_TRUE(CheckTopkRow(logits, std::vector<int32_t>{0, 1, 3}).ok);
  EXPECT_TRUE(CheckTopkRow(logits, std::vector<int32_t>{0, 1, 2}).ok);
  TopkTolerance strict{0, 0};
  EXPECT_FALSE(CheckTopkRow(logits, std::vector<int32_t>{0, 1, 3}, strict).ok);
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

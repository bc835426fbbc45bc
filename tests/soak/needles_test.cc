// The soak's needles (needles.h): where they are planted, that they
// outscore the noise under each K format as the reference scores them, and
// that CheckNeedles finds a missing one.
#include "tests/soak/needles.h"

#include <algorithm>
#include <vector>

#include "client/reference.h"
#include "gtest/gtest.h"

namespace indexer::soak {
namespace {

using client::LayerSpec;

LayerSpec Spec(KvFormat format, int32_t r = 1) {
  LayerSpec s;
  s.layer = 0;
  s.format = format;
  s.compress_ratio = r;
  s.num_heads = 4;
  s.topk = 8;
  return s;
}

// An MXFP4 block layer of `page`-entry blocks, `top` per head and row.
LayerSpec BlockSpec(int32_t page, int32_t top) {
  LayerSpec s = Spec(KvFormat::kMxfp4);
  s.role = client::kRoleBlock;
  s.page_entries = page;
  s.topk_blocks = top;
  s.scale = 0.0884f;
  return s;
}

TEST(NeedleField, NeedlesAtTheirEntriesTheSameBytesForTheSameSalt) {
  const LayerSpec spec = Spec(KvFormat::kFp8, 4);
  NeedleField a(7), b(7);
  const std::vector<int64_t> needles = {5, 403};  // entries 1 and 100
  const std::vector<uint8_t> x = a.Entries(spec, 0, 128, needles, 99);
  const std::vector<uint8_t> y = b.Entries(spec, 0, 128, needles, 99);
  ASSERT_EQ(x.size(), 128u * spec.entry_bytes());
  EXPECT_EQ(x, y);
  const int64_t eb = spec.entry_bytes();
  const auto entry = [&](const std::vector<uint8_t>& v, int64_t e) {
    return std::vector<uint8_t>(v.begin() + e * eb, v.begin() + (e + 1) * eb);
  };
  EXPECT_EQ(entry(x, 1), entry(x, 100));  // both the needle
  EXPECT_NE(entry(x, 0), entry(x, 1));
  EXPECT_NE(entry(x, 2), entry(x, 1));
  // A slice from another start is the same entries.
  const std::vector<uint8_t> tail = a.Entries(spec, 100, 28, needles, 99);
  EXPECT_TRUE(std::equal(tail.begin(), tail.end(), x.begin() + 100 * eb));
  // Another salt moves the noise, not the needles.
  const std::vector<uint8_t> z = a.Entries(spec, 0, 128, needles, 100);
  EXPECT_NE(z, x);
  EXPECT_EQ(entry(z, 1), entry(x, 1));
}

// The premise of the check: as the reference scores them (the daemon's
// formulas), a needle outscores every one of the 4,096 noise entries by far.
TEST(NeedleField, NeedlesOutscoreTheNoiseInEveryFormat) {
  for (KvFormat format : {KvFormat::kFp8, KvFormat::kMxfp4}) {
    const LayerSpec spec = Spec(format);
    NeedleField field(3);
    const int64_t n = kNoiseEntries + 1;
    const std::vector<int64_t> needles = {1234};
    client::ReferenceIndexer ref({spec}, 1);
    ASSERT_TRUE(ref.Append(0, 0, field.Entries(spec, 0, n, needles, 5)).ok());
    const std::vector<float>& u = field.Direction(spec.head_dim);
    std::vector<float> q;
    for (int h = 0; h < spec.num_heads; ++h) q.insert(q.end(), u.begin(), u.end());
    const std::vector<float> w(spec.num_heads, 1.0f / spec.num_heads);
    const client::QuantizedQ qq = client::QuantizeQ(spec, 1, q, w);
    auto logits = ref.Logits(0, 0, qq, 0, n);
    ASSERT_TRUE(logits.ok()) << logits.status();
    const float needle = (*logits)[1234];
    float noise = 0;
    for (int64_t e = 0; e < n; ++e) {
      if (e != 1234) noise = std::max(noise, (*logits)[e]);
    }
    EXPECT_GT(needle, 2 * noise) << "format " << static_cast<int>(format);
    EXPECT_GT(needle, 0);
  }
}

TEST(NeedleField, BlockScoresPutTheNeedlesBlockFirstInEveryHead) {
  const LayerSpec spec = BlockSpec(128, 4);
  NeedleField field(11);
  const int64_t n = kNoiseEntries;
  const std::vector<int64_t> needles = {2000};  // block 15
  client::ReferenceIndexer ref({spec}, 1);
  ASSERT_TRUE(ref.Append(0, 0, field.Entries(spec, 0, n, needles, 1)).ok());
  const std::vector<float>& u = field.Direction(spec.head_dim);
  std::vector<float> q;
  for (int h = 0; h < spec.num_heads; ++h) q.insert(q.end(), u.begin(), u.end());
  for (int h = 0; h < spec.num_heads; ++h) {
    auto scores = ref.BlockScores(0, 0, q, 0, h, n);
    ASSERT_TRUE(scores.ok()) << scores.status();
    const auto best = std::max_element(scores->begin(), scores->end()) - scores->begin();
    EXPECT_EQ(best, 2000 / 128) << "head " << h;
  }
}

TEST(PlaceNeedles, OnePerRegionOfTheContext) {
  client::Rng rng(1);
  for (int i = 0; i < 100; ++i) {
    const std::vector<int64_t> t = PlaceNeedles(rng, 8192, 3);
    ASSERT_EQ(t.size(), 3u);
    EXPECT_LT(t[0], 1024);
    EXPECT_GE(t[1], 8192 / 3);
    EXPECT_LT(t[1], 2 * 8192 / 3);
    EXPECT_GE(t[2], 8192 - 1024);
    EXPECT_LT(t[2], 8192);
  }
  EXPECT_EQ(PlaceNeedles(rng, 8192, 1).size(), 1u);
  EXPECT_TRUE(PlaceNeedles(rng, 8192, 0).empty());
}

TEST(NeedlesPerSeq, ForcedPlacesLeaveFewer) {
  LayerSpec dense = Spec(KvFormat::kFp8);
  EXPECT_EQ(NeedlesPerSeq({dense}), 3);
  LayerSpec block = BlockSpec(64, 6);
  block.init_blocks = 1;
  block.local_blocks = 3;
  EXPECT_EQ(NeedlesPerSeq({dense, block}), 2);
  LayerSpec source = dense;
  source.role = client::kRoleSource;
  source.candidate_topk_blocks = 2;  // one of them pinned
  EXPECT_EQ(NeedlesPerSeq({source}), 1);
}

TEST(CheckNeedles, FindsThemAndNamesAMissingOne) {
  LayerSpec spec = Spec(KvFormat::kFp8);
  spec.topk = 4;
  // Two sequences: 100 tokens before one row, 50 before two rows.
  const std::vector<int64_t> q_lens = {1, 2};
  const std::vector<int64_t> bounds = client::ReplyRowBounds(spec, {100, 50}, q_lens);
  const std::vector<std::vector<int64_t>> needles = {{3, 70}, {10, 60}};  // 60: unseen
  const std::vector<std::string> names = {"a", "b"};
  std::vector<int32_t> topk = {70, 3, 9, -1,  // row 0
                               10, 1, 2, 4,   // row 1 (sees 51 entries)
                               5, 6, 10, 7};  // row 2 (52)
  int64_t found = 0;
  EXPECT_TRUE(CheckNeedles(spec, bounds, q_lens, needles, names, topk, &found).ok());
  EXPECT_EQ(found, 4);
  topk[1] = 8;  // row 0 loses the needle at token 3
  const absl::Status s = CheckNeedles(spec, bounds, q_lens, needles, names, topk, &found);
  EXPECT_EQ(s.code(), absl::StatusCode::kInternal);
  EXPECT_NE(s.message().find("row 0 (a): the needle at token 3 (entry 3) is not in its top-4 of 101"),
            std::string::npos)
      << s.message();
  // A reply of the wrong size.
  topk.pop_back();
  EXPECT_FALSE(CheckNeedles(spec, bounds, q_lens, needles, names, topk, &found).ok());
}

TEST(CheckNeedles, BlockLayersNeedTheBlockInEveryHead) {
  LayerSpec spec = BlockSpec(64, 2);
  spec.num_heads = 2;
  const std::vector<int64_t> q_lens = {1};
  // Row 0 sees 301 entries: 5 blocks.
  const std::vector<int64_t> bounds = client::ReplyRowBounds(spec, {300}, q_lens);
  const std::vector<std::vector<int64_t>> needles = {{130}};  // block 2
  const std::vector<std::string> names = {"s"};
  std::vector<int32_t> topk = {2, 4,   // head 0
                               4, 2};  // head 1
  int64_t found = 0;
  EXPECT_TRUE(CheckNeedles(spec, bounds, q_lens, needles, names, topk, &found).ok());
  EXPECT_EQ(found, 2);
  topk[3] = 0;
  const absl::Status s = CheckNeedles(spec, bounds, q_lens, needles, names, topk, &found);
  EXPECT_NE(s.message().find("head 1): the needle at token 130 (block 2)"), std::string::npos)
      << s.message();
}

}  // namespace
}  // namespace indexer::soak

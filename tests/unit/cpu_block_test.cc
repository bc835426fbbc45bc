// The cpu backend's MiniMax-M3 block path (SPEC §5 "Block path") against a
// plain double-precision reference: block scores, causal blocks, init and
// local sentinels, top-k block ids with ties -> smaller id.
#include <algorithm>
#include <cmath>
#include <cstdint>
#include <memory>
#include <random>
#include <string>
#include <tuple>
#include <vector>

#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "kernels/backend.h"
#include "kernels/cpu/cpu_backend.h"
#include "kernels/format/page_layout.h"
#include "tests/unit/step_test_util.h"

namespace indexer {
namespace {

using ::testing::ElementsAre;
using ::testing::HasSubstr;
using testutil::SeqPlan;

constexpr int32_t kDim = 64;  // scale D^-0.5 = 0.125 exactly

PageLayout MakeLayout(bool tiled, int32_t page_entries, int32_t dim = kDim) {
  int32_t n_per_tile = 0, d_per_tile = 0, lanes = 1;
  if (tiled) {
    n_per_tile = page_entries >= 16 ? page_entries / 4 : page_entries;
    d_per_tile = 16;
    lanes = 2;
  }
  auto layout = PageLayout::Make(KvFormat::kMxfp4, dim, page_entries,
                                 n_per_tile, d_per_tile, lanes);
  EXPECT_TRUE(layout.ok()) << layout.status();
  return *layout;
}

// One step of the block path: the cache written, fp32 queries [rows, Hi, D].
struct BlockStep {
  PageLayout layout;
  StepRows rows;
  std::vector<uint8_t> entries;
  testutil::DecodedK kd;
  std::vector<float> q;
  PoolHandle pool;
  std::unique_ptr<StepContext> ctx;
  int32_t heads = 1;
};

// Exact data: K from the e2m1 alphabet with scales 2^-1..2^1, q from a
// small set of halves, so every fp32 score is exact.
void MakeBlockStep(CpuBackend* backend, const PageLayout& layout,
                   const std::vector<SeqPlan>& plans, int32_t heads, bool exact,
                   std::mt19937* rng, BlockStep* step) {
  step->layout = layout;
  step->heads = heads;
  step->rows = testutil::BuildStep(plans, 1, layout.page_entries, 5, rng);
  auto pool = backend->AllocatePool(layout, testutil::NumPages(step->rows));
  ASSERT_TRUE(pool.ok()) << pool.status();
  step->pool = *pool;
  auto ctx = backend->PrepareStep(layout, step->rows);
  ASSERT_TRUE(ctx.ok()) << ctx.status();
  step->ctx = std::move(*ctx);
  step->entries =
      testutil::MakeEntries(layout, step->rows.NewEntries(), exact, rng);
  ASSERT_TRUE(
      backend
          ->WriteEntries(layout, step->pool, step->rows, step->ctx.get(),
                         {KInput::Kind::kQuantized, step->entries.data(), true})
          .ok());
  step->kd = testutil::DecodeAll(layout, step->entries);
  static const float kValues[] = {0, 0.5f, -0.5f, 1, -1, 2, -2, 3};
  std::uniform_int_distribution<int> value(0, 7);
  std::normal_distribution<float> normal;
  step->q.resize(static_cast<size_t>(step->rows.num_rows) * heads *
                 layout.head_dim);
  for (float& v : step->q) v = exact ? kValues[value(*rng)] : normal(*rng);
}

std::vector<int32_t> RunBlock(CpuBackend* backend, BlockStep* step,
                              const BlockSpec& spec) {
  std::vector<int32_t> out(
      static_cast<size_t>(step->heads) * step->rows.num_rows * spec.topk_blocks,
      -7);
  auto t =
      backend->BlockTopk(step->layout, step->pool, step->rows, step->ctx.get(),
                         {step->heads, step->q.data()}, spec, out.data());
  EXPECT_TRUE(t.ok()) << t.status();
  return out;
}

// Reference block scores of (h, r) over its causal blocks, sentinels in.
// `magnitude` gets each block's largest sum of |scale * q_d * k_d|.
std::vector<double> RefScores(const BlockStep& step, const BlockSpec& spec,
                              int32_t h, int32_t r,
                              std::vector<double>* magnitude = nullptr) {
  const int32_t dim = step.layout.head_dim, per_page = step.layout.page_entries;
  const int32_t n = step.rows.row_visible[r], s = step.rows.row_seq[r];
  const int32_t causal = (n + per_page - 1) / per_page;
  std::vector<double> score(causal, -INFINITY), mag(causal, 0);
  const float* q = step.q.data() + (int64_t{r} * step.heads + h) * dim;
  for (int32_t e = 0; e < n; ++e) {
    const double* k =
        step.kd.k.data() + (int64_t{step.rows.seq_k_begin[s]} + e) * dim;
    double dot = 0, adot = 0;
    for (int32_t d = 0; d < dim; ++d) {
      dot += double{q[d]} * k[d];
      adot += std::fabs(double{q[d]} * k[d]);
    }
    score[e / per_page] = std::max(score[e / per_page], spec.scale * dot);
    mag[e / per_page] = std::max(mag[e / per_page], spec.scale * adot);
  }
  for (int32_t b = std::max(0, causal - spec.local_blocks); b < causal; ++b) {
    score[b] = 1e29f;
  }
  for (int32_t b = 0; b < std::min(causal, spec.init_blocks); ++b) {
    score[b] = 1e30f;
  }
  if (magnitude != nullptr) *magnitude = mag;
  return score;
}

std::vector<int32_t> Iota(int32_t n) {
  std::vector<int32_t> ids(n);
  for (int32_t i = 0; i < n; ++i) ids[i] = i;
  return ids;
}

// Exact data: every (h, r) row equals the reference's set.
void CheckExact(CpuBackend* backend, BlockStep* step, const BlockSpec& spec) {
  const std::vector<int32_t> out = RunBlock(backend, step, spec);
  const int32_t k = spec.topk_blocks, nr = step->rows.num_rows;
  for (int32_t h = 0; h < step->heads; ++h) {
    for (int32_t r = 0; r < nr; ++r) {
      const std::vector<double> score = RefScores(*step, spec, h, r);
      ASSERT_EQ(testutil::RowSet(out.data() + (int64_t{h} * nr + r) * k, k),
                testutil::RefTopIds(
                    score, Iota(static_cast<int32_t>(score.size())), k))
          << "head " << h << " row " << r << " of " << step->rows.row_visible[r]
          << " entries, init " << spec.init_blocks << " local "
          << spec.local_blocks;
    }
  }
}

BlockSpec Spec(int32_t topk, int32_t init, int32_t local) {
  BlockSpec spec;
  spec.topk_blocks = topk;
  spec.init_blocks = init;
  spec.local_blocks = local;
  spec.scale = 0.125f;
  return spec;
}

using ShapeParam = std::tuple<bool /*tiled*/, int32_t /*E*/, int32_t /*batch*/,
                              int32_t /*topk_blocks*/>;

std::string ShapeName(const testing::TestParamInfo<ShapeParam>& info) {
  const auto [tiled, e, batch, topk] = info.param;
  return std::string(tiled ? "tiled" : "linear") + "_E" + std::to_string(e) +
         "_B" + std::to_string(batch) + "_top" + std::to_string(topk);
}

class BlockShapeTest : public testing::TestWithParam<ShapeParam> {};

// Mixed decode and prefill rows, two heads, every sentinel arrangement.
TEST_P(BlockShapeTest, MatchesReference) {
  const auto [tiled, page_entries, batch, topk] = GetParam();
  CpuBackend backend(2);
  std::mt19937 rng(page_entries * 131 + batch * 17 + topk + (tiled ? 7 : 0));
  std::uniform_int_distribution<int> old_len(0, 700), decode(1, 2),
      prefill(3, 12), coin(0, 2);
  std::vector<SeqPlan> plans(batch);
  for (SeqPlan& p : plans) {
    p.old_tokens = old_len(rng);
    p.q_len = coin(rng) == 0 ? prefill(rng) : decode(rng);
  }
  BlockStep step;
  MakeBlockStep(&backend, MakeLayout(tiled, page_entries), plans, 2, true, &rng,
                &step);
  for (const auto& [init, local] : std::vector<std::pair<int32_t, int32_t>>{
           {0, 0}, {0, 1}, {1, 2}, {3, 2}}) {
    CheckExact(&backend, &step, Spec(topk, init, local));
  }
}

INSTANTIATE_TEST_SUITE_P(Shapes, BlockShapeTest,
                         testing::Combine(testing::Bool(),
                                          testing::Values(1, 3, 16, 64, 128),
                                          testing::Values(1, 5),
                                          testing::Values(1, 4, 16)),
                         ShapeName);

class BlockTest : public testing::Test {
 protected:
  CpuBackend backend_{2};
  std::mt19937 rng_{77};
};

// One prefill sequence of 16 rows seeing 1..16 entries in blocks of 4:
// init 2 and local 2 overlap while the row has fewer than 4 causal blocks.
TEST_F(BlockTest, InitAndLocalBlocksOverlap) {
  BlockStep step;
  MakeBlockStep(&backend_, MakeLayout(false, 4), {{0, 16}}, 1, true, &rng_,
                &step);
  const BlockSpec spec = Spec(3, 2, 2);
  CheckExact(&backend_, &step, spec);
  const std::vector<int32_t> out = RunBlock(&backend_, &step, spec);
  auto row = [&](int32_t r) {
    return std::vector<int32_t>(out.begin() + r * 3, out.begin() + r * 3 + 3);
  };
  // 1 entry: block 0 only; 5: blocks 0, 1 (both init and local); 9: init
  // 0, 1 and local 2; 13: every block forced, the init pair wins, then the
  // smaller local block.
  EXPECT_THAT(row(0), ElementsAre(0, -1, -1));
  EXPECT_EQ(testutil::RowSet(row(4).data(), 3), (std::vector<int32_t>{0, 1}));
  EXPECT_EQ(testutil::RowSet(row(8).data(), 3),
            (std::vector<int32_t>{0, 1, 2}));
  EXPECT_EQ(testutil::RowSet(row(12).data(), 3),
            (std::vector<int32_t>{0, 1, 2}));
}

// Rows ending exactly on a page boundary and one entry past it, and a
// single-entry sequence.
TEST_F(BlockTest, PageBoundaryAndSingleEntryRows) {
  BlockStep step;
  MakeBlockStep(&backend_, MakeLayout(true, 16), {{31, 2}, {0, 1}}, 2, true,
                &rng_, &step);
  ASSERT_EQ(step.rows.row_visible, (std::vector<int32_t>{32, 33, 1}));
  const BlockSpec spec = Spec(4, 0, 1);
  CheckExact(&backend_, &step, spec);
  const std::vector<int32_t> out = RunBlock(&backend_, &step, spec);
  for (int32_t h = 0; h < 2; ++h) {
    const int32_t* o = out.data() + h * 3 * 4;
    EXPECT_EQ(testutil::RowSet(o, 4), (std::vector<int32_t>{0, 1}));
    EXPECT_EQ(testutil::RowSet(o + 4, 4), (std::vector<int32_t>{0, 1, 2}));
    EXPECT_THAT(std::vector<int32_t>(o + 8, o + 12),
                ElementsAre(0, -1, -1, -1));
  }
}

TEST_F(BlockTest, ArgumentsAreChecked) {
  auto fp8 = PageLayout::Make(KvFormat::kFp8, kDim, 16);
  ASSERT_TRUE(fp8.ok());
  BlockStep step;
  MakeBlockStep(&backend_, MakeLayout(false, 16), {{20, 1}}, 1, true, &rng_,
                &step);
  std::vector<int32_t> out(4);
  auto fp8_pool = backend_.AllocatePool(*fp8, 2);
  ASSERT_TRUE(fp8_pool.ok());
  auto st = backend_.BlockTopk(*fp8, *fp8_pool, step.rows, nullptr,
                               {1, step.q.data()}, Spec(4, 0, 1), out.data());
  EXPECT_EQ(st.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(std::string(st.status().message()), HasSubstr("MXFP4"));
  st = backend_.BlockTopk(step.layout, step.pool, step.rows, step.ctx.get(),
                          {1, step.q.data()}, Spec(4, -1, 1), out.data());
  EXPECT_THAT(std::string(st.status().message()), HasSubstr("init_blocks"));
  st = backend_.BlockTopk(step.layout, step.pool, step.rows, step.ctx.get(),
                          {0, step.q.data()}, Spec(4, 0, 1), out.data());
  EXPECT_THAT(std::string(st.status().message()), HasSubstr("q.num_heads"));
}

// The model's shape (D 128, pages of 128, 4 heads, 16 blocks) on noisy data
// and long rows split over tasks: every chosen block scores within fp32
// summation tolerance of the reference's 16th.
TEST_F(BlockTest, LongRowsMatchReferenceWithinTolerance) {
  BlockStep step;
  MakeBlockStep(&backend_, MakeLayout(false, 128, 128), {{9000, 1}, {3000, 6}},
                4, false, &rng_, &step);
  BlockSpec spec = Spec(16, 1, 2);
  spec.scale = 1.0f / std::sqrt(128.0f);
  const std::vector<int32_t> out = RunBlock(&backend_, &step, spec);
  const int32_t nr = step.rows.num_rows, k = spec.topk_blocks;
  for (int32_t h = 0; h < step.heads; ++h) {
    for (int32_t r = 0; r < nr; ++r) {
      std::vector<double> mag;
      const std::vector<double> score = RefScores(step, spec, h, r, &mag);
      const double tol = 1e-5 * *std::max_element(mag.begin(), mag.end());
      std::vector<double> sorted = score;
      std::sort(sorted.begin(), sorted.end(), std::greater<double>());
      const std::vector<int32_t> got =
          testutil::RowSet(out.data() + (int64_t{h} * nr + r) * k, k);
      ASSERT_EQ(got.size(), static_cast<size_t>(k));
      for (int32_t b : got) EXPECT_GE(score[b], sorted[k - 1] - tol) << b;
      // The forced blocks: init 0, local the last two.
      const int32_t causal = static_cast<int32_t>(score.size());
      for (int32_t b : {0, causal - 2, causal - 1}) {
        EXPECT_TRUE(std::binary_search(got.begin(), got.end(), b)) << b;
      }
    }
  }
}

}  // namespace
}  // namespace indexer

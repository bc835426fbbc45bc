// The cpu backend's two-level candidate path (SPEC §5) against a plain
// double-precision reference: the source's output and pools, consumers in
// their gathered, masked and gated forms (same output), and the step-state
// contract (order, concurrent steps).
#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <memory>
#include <random>
#include <string>
#include <thread>
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

using ::testing::HasSubstr;
using testutil::SeqPlan;

constexpr int32_t kDim = 64;   // two MXFP4 blocks
constexpr int32_t kHeads = 3;  // odd: the kernel's head tail

PageLayout MakeLayout(KvFormat format, bool tiled, int32_t page_entries,
                      int32_t dim = kDim) {
  int32_t n_per_tile = 0, d_per_tile = 0, lanes = 1;
  if (tiled) {
    n_per_tile = page_entries >= 16 ? page_entries / 4 : page_entries;
    d_per_tile = 16;
    lanes = format == KvFormat::kMxfp4 ? 2 : 1;
  }
  auto layout = PageLayout::Make(format, dim, page_entries, n_per_tile,
                                 d_per_tile, lanes);
  EXPECT_TRUE(layout.ok()) << layout.status();
  return *layout;
}

// One step on the cpu backend: its cache written, its context prepared, its
// queries made, and the reference's decoded K.
struct Step {
  PageLayout layout;
  StepRows rows;
  std::vector<uint8_t> entries;
  testutil::DecodedK kd;
  testutil::TestQ q;
  PoolHandle pool;
  std::unique_ptr<StepContext> ctx;
  int32_t heads = kHeads;

  QInput qin() const { return q.input(heads); }
};

void MakeStep(CpuBackend* backend, const PageLayout& layout,
              const std::vector<SeqPlan>& plans, int32_t ratio, bool exact,
              std::mt19937* rng, Step* step, int32_t heads = kHeads,
              bool reference = true) {
  step->layout = layout;
  step->heads = heads;
  step->rows = testutil::BuildStep(plans, ratio, layout.page_entries, 4, rng);
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
  if (reference) step->kd = testutil::DecodeAll(layout, step->entries);
  step->q = testutil::MakeQ(layout, step->rows.num_rows, heads, exact, rng);
}

std::vector<int32_t> Source(CpuBackend* backend, Step* step, int32_t topk,
                            const CandidateSpec& spec) {
  std::vector<int32_t> out(static_cast<size_t>(step->rows.num_rows) * topk, -7);
  auto t = backend->CandidateSource(step->layout, step->pool, step->rows,
                                    step->ctx.get(), step->qin(), topk, spec,
                                    out.data());
  EXPECT_TRUE(t.ok()) << t.status();
  return out;
}

std::vector<int32_t> Consume(CpuBackend* backend, Step* step, int32_t topk,
                             const CandidateSpec& spec, ConsumerMode mode) {
  std::vector<int32_t> out(static_cast<size_t>(step->rows.num_rows) * topk, -7);
  auto t = backend->CandidateConsumer(step->layout, step->pool, step->rows,
                                      step->ctx.get(), step->qin(), topk, spec,
                                      mode, out.data());
  EXPECT_TRUE(t.ok()) << t.status();
  return out;
}

// The reference pool of a row: ascending block ids (SPEC §5).
std::vector<int32_t> RefPool(const std::vector<double>& logits,
                             const CandidateSpec& spec) {
  const int32_t n = static_cast<int32_t>(logits.size());
  const int32_t bs = spec.block_size, nb = (n + bs - 1) / bs;
  std::vector<double> maxima(nb, -INFINITY);
  std::vector<int32_t> ids(nb);
  for (int32_t e = 0; e < n; ++e)
    maxima[e / bs] = std::max(maxima[e / bs], logits[e]);
  for (int32_t b = 0; b < nb; ++b) ids[b] = b;
  if (nb <= spec.topk_blocks) return ids;
  // The weakest chosen block: the last in (maximum desc, id asc) order.
  std::vector<int32_t> order = ids;
  std::sort(order.begin(), order.end(), [&](int32_t a, int32_t b) {
    return maxima[a] != maxima[b] ? maxima[a] > maxima[b] : a < b;
  });
  order.resize(spec.topk_blocks);
  if (spec.pin_newest &&
      std::find(order.begin(), order.end(), nb - 1) == order.end()) {
    order.back() = nb - 1;
  }
  std::sort(order.begin(), order.end());
  return order;
}

// Reference consumer of a row: the topk best pool entries, ascending.
std::vector<int32_t> RefConsumer(const std::vector<double>& logits,
                                 const std::vector<int32_t>& pool,
                                 const CandidateSpec& spec, int32_t topk) {
  const int32_t n = static_cast<int32_t>(logits.size());
  std::vector<double> values;
  std::vector<int32_t> ids;
  for (int32_t b : pool) {
    for (int32_t e = b * spec.block_size;
         e < std::min(n, (b + 1) * spec.block_size); ++e) {
      values.push_back(logits[e]);
      ids.push_back(e);
    }
  }
  return testutil::RefTopIds(values, ids, topk);
}

std::vector<int32_t> Iota(int32_t n) {
  std::vector<int32_t> ids(n);
  for (int32_t i = 0; i < n; ++i) ids[i] = i;
  return ids;
}

// Runs dense, the source and consumers (every mode, several topk) on `step`
// and checks them against each other and, with exact data, the reference.
void CheckCandidatePath(CpuBackend* backend, Step* step,
                        const CandidateSpec& spec, bool exact) {
  const StepRows& rows = step->rows;
  const int32_t topk = 6;
  std::vector<int32_t> dense(static_cast<size_t>(rows.num_rows) * topk);
  ASSERT_TRUE(backend
                  ->DenseTopk(step->layout, step->pool, rows, step->ctx.get(),
                              step->qin(), topk, dense.data())
                  .ok());
  const std::vector<int32_t> source = Source(backend, step, topk, spec);
  ASSERT_EQ(source, dense) << "the source's output is the dense path's";

  std::vector<std::vector<double>> logits(rows.num_rows);
  std::vector<std::vector<int32_t>> pools(rows.num_rows);
  for (int32_t r = 0; r < rows.num_rows; ++r) {
    logits[r] = testutil::RefLogits(step->layout, rows, step->kd, step->q,
                                    step->heads, r);
    pools[r] = RefPool(logits[r], spec);
    if (!exact) continue;
    const int32_t n = rows.row_visible[r];
    ASSERT_EQ(testutil::RowSet(source.data() + int64_t{r} * topk, topk),
              testutil::RefTopIds(logits[r], Iota(n), topk))
        << "source row " << r << " of " << n << " entries";
  }

  const int32_t pool_entries = spec.topk_blocks * spec.block_size;
  for (int32_t k : {1, 5, 37, pool_entries}) {
    const std::vector<int32_t> gather =
        Consume(backend, step, k, spec, ConsumerMode::kGather);
    const std::vector<int32_t> masked =
        Consume(backend, step, k, spec, ConsumerMode::kMasked);
    ASSERT_EQ(gather, masked) << "topk " << k;
    ASSERT_EQ(Consume(backend, step, k, spec, ConsumerMode::kAuto), gather);
    for (int32_t r = 0; r < rows.num_rows; ++r) {
      const std::vector<int32_t> got =
          testutil::RowSet(gather.data() + int64_t{r} * k, k);
      if (exact) {
        ASSERT_EQ(got, RefConsumer(logits[r], pools[r], spec, k))
            << "row " << r << " of " << rows.row_visible[r] << " entries, topk "
            << k;
      } else if (k == pool_entries) {
        // Every entry of the pool: its block count and pinned newest block
        // hold whatever near-ties the fp32 maxima break.
        std::vector<int32_t> blocks;
        for (int32_t e : got) {
          if (blocks.empty() || blocks.back() != e / spec.block_size) {
            blocks.push_back(e / spec.block_size);
          }
        }
        ASSERT_EQ(blocks.size(), pools[r].size()) << "row " << r;
        if (spec.pin_newest && !blocks.empty()) {
          EXPECT_EQ(blocks.back(), pools[r].back()) << "row " << r;
        }
      }
    }
  }
}

using ShapeParam =
    std::tuple<KvFormat, bool /*tiled*/, int32_t /*E*/, int32_t /*batch*/,
               int32_t /*block_size*/, int32_t /*topk_blocks*/>;

std::string ShapeName(const testing::TestParamInfo<ShapeParam>& info) {
  const auto [format, tiled, e, batch, bs, tb] = info.param;
  return std::string(KvFormatName(format)) + (tiled ? "_tiled" : "_linear") +
         "_E" + std::to_string(e) + "_B" + std::to_string(batch) + "_bs" +
         std::to_string(bs) + "_pool" + std::to_string(tb);
}

class CandidateShapeTest : public testing::TestWithParam<ShapeParam> {};

// Mixed decode and prefill rows at compress ratios 1 and 4, exact data
// (checked against the reference) and noisy data (checked for agreement).
TEST_P(CandidateShapeTest, SourceAndConsumersAgreeWithReference) {
  const auto [format, tiled, page_entries, batch, bs, topk_blocks] = GetParam();
  const PageLayout layout = MakeLayout(format, tiled, page_entries);
  CpuBackend backend(2);
  std::mt19937 rng(page_entries * 7919 + batch * 31 + bs * 7 + topk_blocks +
                   (tiled ? 1000 : 0) + (format == KvFormat::kFp8 ? 0 : 50000));
  std::uniform_int_distribution<int> old_len(0, 260), decode(1, 2),
      prefill(3, 12), coin(0, 2);
  for (int32_t ratio : {1, 4}) {
    for (bool exact : {true, false}) {
      std::vector<SeqPlan> plans(batch);
      for (SeqPlan& p : plans) {
        p.old_tokens = old_len(rng);
        p.q_len = coin(rng) == 0 ? prefill(rng) : decode(rng);
      }
      Step step;
      MakeStep(&backend, layout, plans, ratio, exact, &rng, &step);
      CandidateSpec spec;
      spec.set = ratio;
      spec.block_size = bs;
      spec.topk_blocks = topk_blocks;
      spec.pin_newest = (page_entries + bs) % 2 == 1 || exact;
      SCOPED_TRACE(testing::Message()
                   << "ratio " << ratio << (exact ? " exact" : " noisy"));
      CheckCandidatePath(&backend, &step, spec, exact);
    }
  }
}

INSTANTIATE_TEST_SUITE_P(
    Shapes, CandidateShapeTest,
    testing::Combine(testing::Values(KvFormat::kFp8, KvFormat::kMxfp4),
                     testing::Bool(), testing::Values(1, 3, 16, 64),
                     testing::Values(1, 5), testing::Values(1, 3, 8),
                     testing::Values(1, 4, 64)),
    ShapeName);

class CandidateTest : public testing::Test {
 protected:
  CandidateSpec Spec(int32_t bs, int32_t topk_blocks, bool pin = true) {
    CandidateSpec spec;
    spec.block_size = bs;
    spec.topk_blocks = topk_blocks;
    spec.pin_newest = pin;
    return spec;
  }
  CpuBackend backend_{2};
  std::mt19937 rng_{20240};
};

// Rows that end exactly on a block boundary and one entry past it, a single
// entry, and rows with fewer blocks than the pool.
TEST_F(CandidateTest, BoundaryAndShortRows) {
  const PageLayout layout = MakeLayout(KvFormat::kFp8, false, 16);
  // Next_n 2 at 24 tokens: rows see 23 and 24 entries; 24 = 3 blocks of 8.
  // A second pair sees 24 and 25 (one past the boundary); then one entry;
  // then 9 entries (2 blocks, fewer than the pool of 3).
  Step step;
  MakeStep(&backend_, layout, {{22, 2}, {23, 2}, {0, 1}, {8, 1}}, 1, true,
           &rng_, &step);
  ASSERT_EQ(step.rows.row_visible,
            (std::vector<int32_t>{23, 24, 24, 25, 1, 9}));
  CheckCandidatePath(&backend_, &step, Spec(8, 2), true);
  CheckCandidatePath(&backend_, &step, Spec(8, 3), true);
  CheckCandidatePath(&backend_, &step, Spec(1, 4), true);

  // The whole pool, by position: the one-entry row holds entry 0, the
  // 9-entry row both of its blocks, the 25-entry row its 1-entry block 3.
  const CandidateSpec spec = Spec(8, 3);
  Source(&backend_, &step, 1, spec);
  const std::vector<int32_t> all =
      Consume(&backend_, &step, 24, spec, ConsumerMode::kGather);
  EXPECT_EQ(testutil::RowSet(all.data() + 4 * 24, 24), std::vector<int32_t>{0});
  EXPECT_EQ(testutil::RowSet(all.data() + 5 * 24, 24), Iota(9));
  const std::vector<int32_t> row3 = testutil::RowSet(all.data() + 3 * 24, 24);
  EXPECT_EQ(row3.size(), 17u);
  EXPECT_EQ(row3.back(), 24);
}

// The newest block scores lowest (its K is zero, every other logit is
// positive): pinned, it replaces the weakest chosen block; unpinned, it is
// left out.
TEST_F(CandidateTest, PinnedNewestBlockWithTheLowestMaximum) {
  const PageLayout layout = MakeLayout(KvFormat::kFp8, false, 4);
  Step step;
  MakeStep(&backend_, layout, {{37, 1}}, 1, true, &rng_, &step, 1);
  // One head, weight 1, q = +1 everywhere; K is constant per entry: 0.5,
  // except entry 3 of blocks 0..3 (maxima 3, 3, 1, 2) and the zeros of the
  // newest block 4 (entries 32..37).
  const uint8_t one = testutil::E4m3Code(1.0f);
  std::fill(step.q.values.begin(), step.q.values.end(), one);
  std::fill(step.q.decoded.begin(), step.q.decoded.end(), 1.0);
  step.q.weights = {1.0f};
  const float block_max[] = {3, 3, 1, 2};
  const int32_t eb = layout.entry_bytes();
  for (int32_t e = 0; e < 38; ++e) {
    const float v = e >= 32 ? 0.0f : e % 8 == 3 ? block_max[e / 8] : 0.5f;
    std::fill(step.entries.begin() + int64_t{e} * eb,
              step.entries.begin() + int64_t{e} * eb + kDim,
              testutil::E4m3Code(v));
    const float scale = 1.0f;
    std::memcpy(step.entries.data() + int64_t{e} * eb + kDim, &scale, 4);
  }
  ASSERT_TRUE(
      backend_
          .WriteEntries(layout, step.pool, step.rows, step.ctx.get(),
                        {KInput::Kind::kQuantized, step.entries.data(), true})
          .ok());
  step.kd = testutil::DecodeAll(layout, step.entries);
  for (bool pin : {true, false}) {
    const CandidateSpec spec = Spec(8, 2, pin);
    CheckCandidatePath(&backend_, &step, spec, true);
    Source(&backend_, &step, 1, spec);
    const std::vector<int32_t> all =
        Consume(&backend_, &step, 16, spec, ConsumerMode::kMasked);
    const std::vector<int32_t> got = testutil::RowSet(all.data(), 16);
    std::vector<int32_t> blocks;
    for (int32_t e : got) {
      if (blocks.empty() || blocks.back() != e / 8) blocks.push_back(e / 8);
    }
    // Blocks 0 and 1 tie for the top two; the weaker of the tie is the
    // larger id, so pinned, block 4 replaces block 1.
    EXPECT_EQ(blocks, pin ? (std::vector<int32_t>{0, 4})
                          : (std::vector<int32_t>{0, 1}));
  }
}

// Next_n 2 at compress ratio 4: the two rows of a sequence see different
// entry counts and get different pools.
TEST_F(CandidateTest, NextN2AtRatio4) {
  for (KvFormat format : {KvFormat::kFp8, KvFormat::kMxfp4}) {
    const PageLayout layout = MakeLayout(format, true, 16);
    Step step;
    // Rows at tokens 158, 159 see 39 and 40 entries; 162, 163: 40 and 41;
    // 34, 35: 8 and 9.
    MakeStep(&backend_, layout, {{158, 2}, {162, 2}, {34, 2}}, 4, true, &rng_,
             &step);
    ASSERT_EQ(step.rows.row_visible,
              (std::vector<int32_t>{39, 40, 40, 41, 8, 9}));
    for (int32_t bs : {1, 3, 8})
      CheckCandidatePath(&backend_, &step, Spec(bs, 3), true);
  }
}

TEST_F(CandidateTest, ConsumerBeforeSourceFailsPrecondition) {
  const PageLayout layout = MakeLayout(KvFormat::kMxfp4, false, 16);
  Step step;
  MakeStep(&backend_, layout, {{40, 1}, {10, 3}}, 1, false, &rng_, &step);
  CandidateSpec spec = Spec(8, 2);
  spec.set = 1;
  std::vector<int32_t> out(static_cast<size_t>(step.rows.num_rows) * 4);
  for (ConsumerMode mode :
       {ConsumerMode::kAuto, ConsumerMode::kGather, ConsumerMode::kMasked}) {
    auto st =
        backend_.CandidateConsumer(layout, step.pool, step.rows, step.ctx.get(),
                                   step.qin(), 4, spec, mode, out.data());
    ASSERT_FALSE(st.ok());
    EXPECT_EQ(st.status().code(), absl::StatusCode::kFailedPrecondition);
    EXPECT_THAT(std::string(st.status().message()),
                HasSubstr("candidate set 1: the source layer has not run"));
  }
  // Set 0's source does not serve set 1; a new step starts without pools.
  spec.set = 0;
  Source(&backend_, &step, 4, spec);
  spec.set = 1;
  EXPECT_EQ(backend_
                .CandidateConsumer(layout, step.pool, step.rows, step.ctx.get(),
                                   step.qin(), 4, spec, ConsumerMode::kGather,
                                   out.data())
                .status()
                .code(),
            absl::StatusCode::kFailedPrecondition);
  spec.set = 0;
  auto next = backend_.PrepareStep(layout, step.rows);
  ASSERT_TRUE(next.ok());
  EXPECT_EQ(backend_
                .CandidateConsumer(layout, step.pool, step.rows, next->get(),
                                   step.qin(), 4, spec, ConsumerMode::kGather,
                                   out.data())
                .status()
                .code(),
            absl::StatusCode::kFailedPrecondition);
}

TEST_F(CandidateTest, BadArgumentsAreRejected) {
  const PageLayout layout = MakeLayout(KvFormat::kFp8, false, 16);
  Step step;
  MakeStep(&backend_, layout, {{40, 1}}, 1, false, &rng_, &step);
  std::vector<int32_t> out(4);
  CandidateSpec spec = Spec(8, 2);
  // No context (pools live in it), or another step's rows.
  auto st = backend_.CandidateSource(layout, step.pool, step.rows, nullptr,
                                     step.qin(), 4, spec, out.data());
  EXPECT_EQ(st.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(std::string(st.status().message()), HasSubstr("ctx"));
  spec.block_size = 0;
  st = backend_.CandidateSource(layout, step.pool, step.rows, step.ctx.get(),
                                step.qin(), 4, spec, out.data());
  EXPECT_THAT(std::string(st.status().message()),
              HasSubstr("candidate_block_size"));
  spec = Spec(8, 0);
  st = backend_.CandidateSource(layout, step.pool, step.rows, step.ctx.get(),
                                step.qin(), 4, spec, out.data());
  EXPECT_THAT(std::string(st.status().message()),
              HasSubstr("candidate_topk_blocks"));
  // A consumer whose geometry is not its source's.
  Source(&backend_, &step, 4, Spec(8, 2));
  st = backend_.CandidateConsumer(layout, step.pool, step.rows, step.ctx.get(),
                                  step.qin(), 4, Spec(4, 2),
                                  ConsumerMode::kGather, out.data());
  EXPECT_EQ(st.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(std::string(st.status().message()), HasSubstr("block_size"));
  // Rows other than the source's; a copy of them (moved StepRows) is fine.
  StepRows other = step.rows;
  st = backend_.CandidateConsumer(layout, step.pool, other, step.ctx.get(),
                                  step.qin(), 4, Spec(8, 2),
                                  ConsumerMode::kMasked, out.data());
  EXPECT_TRUE(st.ok()) << st.status();
  other.row_visible[0] -= 1;
  st = backend_.CandidateConsumer(layout, step.pool, other, step.ctx.get(),
                                  step.qin(), 4, Spec(8, 2),
                                  ConsumerMode::kGather, out.data());
  EXPECT_EQ(st.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(std::string(st.status().message()), HasSubstr("rows"));
}

// Two steps (two contexts, two caches, different pools) run their sources
// and consumers on two threads at once; each gets what it gets alone.
TEST_F(CandidateTest, ConcurrentStepsKeepTheirOwnPools) {
  const PageLayout layout = MakeLayout(KvFormat::kMxfp4, false, 16);
  Step a, b;
  MakeStep(&backend_, layout, {{300, 1}, {200, 2}, {90, 5}}, 1, false, &rng_,
           &a);
  MakeStep(&backend_, layout, {{250, 2}, {120, 1}}, 1, false, &rng_, &b);
  const CandidateSpec spec = Spec(4, 6);
  const int32_t topk = 9;
  Source(&backend_, &a, topk, spec);
  Source(&backend_, &b, topk, spec);
  const std::vector<int32_t> want_a =
      Consume(&backend_, &a, topk, spec, ConsumerMode::kGather);
  const std::vector<int32_t> want_b =
      Consume(&backend_, &b, topk, spec, ConsumerMode::kGather);
  ASSERT_NE(want_a, want_b);
  // Fresh contexts, so the sources run concurrently too.
  a.ctx = *backend_.PrepareStep(layout, a.rows);
  b.ctx = *backend_.PrepareStep(layout, b.rows);
  auto run = [&](Step* step, const std::vector<int32_t>* want, int* failures) {
    Source(&backend_, step, topk, spec);
    for (int i = 0; i < 30; ++i) {
      const ConsumerMode mode = i % 3 == 0   ? ConsumerMode::kGather
                                : i % 3 == 1 ? ConsumerMode::kMasked
                                             : ConsumerMode::kAuto;
      if (Consume(&backend_, step, topk, spec, mode) != *want) ++*failures;
    }
  };
  int fail_a = 0, fail_b = 0;
  std::thread ta(run, &a, &want_a, &fail_a);
  std::thread tb(run, &b, &want_b, &fail_b);
  ta.join();
  tb.join();
  EXPECT_EQ(fail_a, 0);
  EXPECT_EQ(fail_b, 0);
}

// Not a check: consumer against dense at a production-like decode shape.
// Run with --gtest_also_run_disabled_tests.
TEST(CandidateTiming, DISABLED_ConsumerVsDense) {
  const int32_t batch = 8, entries = 32768, heads = 32, topk = 512;
  const PageLayout layout = MakeLayout(KvFormat::kFp8, false, 64, 128);
  CpuBackend backend(0);
  std::mt19937 rng(3);
  Step step;
  std::vector<SeqPlan> plans(batch, SeqPlan{entries - 1, 1});
  MakeStep(&backend, layout, plans, 1, false, &rng, &step, heads,
           /*reference=*/false);
  CandidateSpec spec;
  spec.block_size = 8;
  spec.topk_blocks = 2048;
  std::vector<int32_t> out(static_cast<size_t>(batch) * topk);
  auto time = [&](auto&& fn) {
    fn();  // warm-up
    const auto t0 = std::chrono::steady_clock::now();
    const int reps = 3;
    for (int i = 0; i < reps; ++i) fn();
    return std::chrono::duration<double, std::milli>(
               std::chrono::steady_clock::now() - t0)
               .count() /
           reps;
  };
  const double dense = time([&] {
    ASSERT_TRUE(backend
                    .DenseTopk(layout, step.pool, step.rows, step.ctx.get(),
                               step.qin(), topk, out.data())
                    .ok());
  });
  const double source = time([&] { Source(&backend, &step, topk, spec); });
  const double gather = time(
      [&] { Consume(&backend, &step, topk, spec, ConsumerMode::kGather); });
  const double masked = time(
      [&] { Consume(&backend, &step, topk, spec, ConsumerMode::kMasked); });
  std::printf(
      "cpu (%d threads), batch %d x %d entries, H %d, D 128, topk %d, "
      "pool 2048 x 8: dense %.1f ms, source %.1f ms, consumer gather "
      "%.1f ms, masked %.1f ms\n",
      backend.threads(), batch, entries, heads, topk, dense, source, gather,
      masked);
  for (ConsumerMode mode : {ConsumerMode::kGather, ConsumerMode::kMasked}) {
    auto t =
        backend.CandidateConsumer(layout, step.pool, step.rows, step.ctx.get(),
                                  step.qin(), topk, spec, mode, out.data());
    ASSERT_TRUE(t.ok());
    std::printf("  %s: logits %.1f ms, top-k %.1f ms\n",
                mode == ConsumerMode::kGather ? "gather" : "masked",
                t->logits_us / 1e3, t->topk_us / 1e3);
  }
}

}  // namespace
}  // namespace indexer

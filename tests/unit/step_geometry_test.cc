// kernels/geometry/step_geometry: token arithmetic, candidate pool slots,
// step rows for odd geometries and the prefill chunk plan against the
// logits budget.
#include "kernels/geometry/step_geometry.h"

#include <algorithm>
#include <cstdint>
#include <random>
#include <utility>
#include <vector>

#include "gtest/gtest-spi.h"
#include "gtest/gtest.h"

namespace indexer {
namespace {

using Chunks = std::vector<std::pair<int32_t, int32_t>>;

TEST(TokenArithmetic, EntriesVisibleAndPages) {
  EXPECT_EQ(EntriesFor(10, 4), 2);
  EXPECT_EQ(EntriesFor(3, 4), 0);
  EXPECT_EQ(NewEntriesFor(10, 3, 4), 1);  // 13/4 - 10/4
  EXPECT_EQ(NewEntriesFor(10, 1, 4), 0);  // no entry completes
  EXPECT_EQ(NewEntriesFor(7, 1, 4), 1);   // token 7 completes entry 1
  EXPECT_EQ(VisibleEntries(0, 4), 0);
  EXPECT_EQ(VisibleEntries(3, 4), 1);
  EXPECT_EQ(VisibleEntries(0, 1), 1);
  EXPECT_EQ(PagesFor(0, 16), 0);
  EXPECT_EQ(PagesFor(1, 16), 1);
  EXPECT_EQ(PagesFor(16, 16), 1);
  EXPECT_EQ(PagesFor(17, 16), 2);
  EXPECT_EQ(PagesFor(5, 1), 5);
  EXPECT_EQ(PagesForTokens(67, 4, 3), 6);  // 16 entries in pages of 3
  EXPECT_EQ(LogicalPage(0, 3), 0);
  EXPECT_EQ(LogicalPage(5, 3), 1);
  EXPECT_EQ(SlotInPage(5, 3), 2);
  EXPECT_EQ(LogicalPage(64, 64), 1);
  EXPECT_EQ(SlotInPage(64, 64), 0);
}

// SPEC §5's candidate pool: slots number the pool's entries in position
// order; only the newest block (holding entry n - 1) can be partial.
TEST(CandidatePoolGeometry, EntriesAndSlots) {
  // n = 21 in blocks of 8: blocks 0, 1 whole, block 2 holds 5 entries.
  EXPECT_EQ(PoolEntries(21, 8, 2, /*has_newest=*/true), 8 + 5);
  EXPECT_EQ(PoolEntries(21, 8, 2, /*has_newest=*/false), 16);
  EXPECT_EQ(PoolEntries(21, 8, 3, /*has_newest=*/true), 21);  // every block
  EXPECT_EQ(PoolEntries(24, 8, 2, /*has_newest=*/true), 16);  // newest whole
  EXPECT_EQ(PoolEntries(1, 8, 1, /*has_newest=*/true), 1);    // one entry
  EXPECT_EQ(PoolEntries(5, 1, 3, /*has_newest=*/true), 3);    // blocks of one

  // Pool {0, 2} of n = 21: slots 0-7 are entries 0-7, slots 8-12 entries 16-20.
  const int32_t blocks[] = {0, 2};
  std::vector<int32_t> entries;
  for (int32_t j = 0; j < PoolEntries(21, 8, 2, true); ++j) {
    entries.push_back(PoolSlotEntry(blocks, 8, j));
  }
  const std::vector<int32_t> want = {0, 1, 2, 3, 4, 5, 6, 7, 16, 17, 18, 19, 20};
  EXPECT_EQ(entries, want);
  // Ascending blocks give ascending entries, all below n.
  const int32_t scattered[] = {3, 9, 10, 41};
  int32_t last = -1;
  for (int32_t j = 0; j < PoolEntries(41 * 16 + 3, 16, 4, true); ++j) {
    const int32_t e = PoolSlotEntry(scattered, 16, j);
    EXPECT_GT(e, last) << "slot " << j;
    EXPECT_LT(e, 41 * 16 + 3) << "slot " << j;
    last = e;
  }
  EXPECT_EQ(last, 41 * 16 + 2);
}

// Brute force: the same quantities from first principles, token by token.
void CheckRows(const std::vector<int64_t>& old_len, const std::vector<int64_t>& q_len,
               int32_t r, int32_t page_entries) {
  SCOPED_TRACE(testing::Message() << "r " << r << " page_entries " << page_entries);
  const size_t n = old_len.size();
  std::vector<std::vector<int32_t>> old_pages(n), new_pages(n);
  int32_t next = 100;
  std::vector<StepRowsInput> in(n);
  for (size_t s = 0; s < n; ++s) {
    int64_t e_old = 0, e_new = 0;
    for (int64_t t = 1; t <= old_len[s]; ++t) e_old += t % r == 0;
    e_new = e_old;
    for (int64_t t = old_len[s] + 1; t <= old_len[s] + q_len[s]; ++t) e_new += t % r == 0;
    const int64_t p_old = (e_old + page_entries - 1) / page_entries;
    const int64_t p_new = (e_new + page_entries - 1) / page_entries;
    ASSERT_EQ(PagesForTokens(old_len[s], r, page_entries), p_old);
    ASSERT_EQ(PagesForTokens(old_len[s] + q_len[s], r, page_entries), p_new);
    for (int64_t i = 0; i < p_old; ++i) old_pages[s].push_back(next++);
    for (int64_t i = p_old; i < p_new; ++i) new_pages[s].push_back(next++);
    in[s] = {old_len[s], q_len[s], &old_pages[s], &new_pages[s]};
  }
  const StepRows rows = BuildStepRows(in, r, INT64_MAX);
  ASSERT_EQ(rows.num_seqs, static_cast<int32_t>(n));
  ASSERT_EQ(rows.compress_ratio, r);
  int32_t row = 0, k = 0, max_pages = 0, max_visible = 0;
  for (size_t s = 0; s < n; ++s) {
    EXPECT_EQ(rows.seq_row_begin[s], row);
    EXPECT_EQ(rows.seq_k_begin[s], k);
    int64_t e_old = 0;
    for (int64_t t = 1; t <= old_len[s]; ++t) e_old += t % r == 0;
    EXPECT_EQ(rows.seq_old_entries[s], e_old);
    int64_t e = e_old;
    for (int64_t p = old_len[s]; p < old_len[s] + q_len[s]; ++p, ++row) {
      e += (p + 1) % r == 0;  // token p completes an entry
      EXPECT_EQ(rows.row_visible[row], e) << "row " << row;
      EXPECT_EQ(rows.row_seq[row], static_cast<int32_t>(s));
      max_visible = std::max<int32_t>(max_visible, e);
    }
    EXPECT_EQ(rows.seq_new_entries[s], e);
    k += static_cast<int32_t>(e - e_old);
    const int32_t pages = static_cast<int32_t>(old_pages[s].size() + new_pages[s].size());
    max_pages = std::max(max_pages, pages);
  }
  EXPECT_EQ(rows.num_rows, row);
  EXPECT_EQ(rows.seq_row_begin[n], row);
  EXPECT_EQ(rows.NewEntries(), k);
  EXPECT_EQ(rows.max_visible, max_visible);
  ASSERT_EQ(rows.max_pages, max_pages);
  for (size_t s = 0; s < n; ++s) {
    int32_t lp = 0;
    for (int32_t p : old_pages[s]) EXPECT_EQ(rows.Page(s, lp++), p);
    for (int32_t p : new_pages[s]) EXPECT_EQ(rows.Page(s, lp++), p);
    for (; lp < rows.max_pages; ++lp) EXPECT_EQ(rows.Page(s, lp), -1);
  }
  PageLayout layout;
  layout.format = KvFormat::kFp8;
  layout.head_dim = 128;
  layout.page_entries = page_entries;
  EXPECT_TRUE(ValidateStepRows(layout, rows, next).ok()) << ValidateStepRows(layout, rows, next);
}

TEST(StepRowsTest, OddGeometries) {
  for (int32_t r : {1, 4}) {
    for (int32_t pe : {1, 3, 16, 64}) {
      // Decode rows, a prefill spanning several pages, a step completing no
      // entry at r 4 (old 9, q 2: tokens 10, 11 -> entries 2, 2), a new
      // sequence of one token, a q_len crossing page boundaries.
      CheckRows({0, 9, 0, 62, 200, 5}, {1, 2, 1, 70, 3, 130}, r, pe);
    }
  }
}

TEST(StepRowsTest, EmptyNewEntries) {
  const std::vector<int32_t> old_pages = {7}, none;
  // r 4: tokens 5 -> 6 complete no entry; the step writes nothing.
  const StepRows rows = BuildStepRows({{5, 1, &old_pages, &none}}, 4, 1 << 20);
  EXPECT_EQ(rows.NewEntries(), 0);
  EXPECT_EQ(rows.seq_old_entries[0], 1);
  EXPECT_EQ(rows.seq_new_entries[0], 1);
  ASSERT_EQ(rows.num_rows, 1);
  EXPECT_EQ(rows.row_visible[0], 1);
  EXPECT_EQ(rows.max_pages, 1);
  EXPECT_EQ(rows.Page(0, 0), 7);
}

TEST(StepRowsTest, CachedLenWritesFromThere) {
  const std::vector<std::vector<int32_t>> pages = {{3, 1}};
  // 10 tokens before, 2 new, but the cache is filled from 0 in this step.
  const StepRows rows = BuildStepRowsFromPages({10}, {2}, pages, 1, INT64_MAX, {0});
  EXPECT_EQ(rows.seq_old_entries[0], 0);
  EXPECT_EQ(rows.seq_new_entries[0], 12);
  EXPECT_EQ(rows.NewEntries(), 12);
  ASSERT_EQ(rows.num_rows, 2);
  EXPECT_EQ(rows.row_visible[0], 11);
  EXPECT_EQ(rows.row_visible[1], 12);
}

// Every chunk within the budget unless a single row; all rows, in order.
void ExpectPlanValid(const std::vector<int32_t>& visible, int64_t budget, const Chunks& chunks) {
  const int32_t n = static_cast<int32_t>(visible.size());
  int32_t next = 0;
  for (const auto& [b, e] : chunks) {
    ASSERT_EQ(b, next) << "chunks must cover the rows in order";
    ASSERT_GT(e, b) << "empty chunk";
    int64_t widest = 0;
    for (int32_t r = b; r < e; ++r) widest = std::max<int64_t>(widest, visible[r]);
    if (e - b > 1) {
      EXPECT_LE((e - b) * widest * 4, budget) << "chunk [" << b << ", " << e << ")";
    }
    next = e;
  }
  EXPECT_EQ(next, n);
}

TEST(ChunkPlanTest, UnderTheBudget) {
  std::mt19937 rng(7);
  for (int trial = 0; trial < 200; ++trial) {
    std::vector<int32_t> visible(1 + rng() % 300);
    for (int32_t& v : visible) v = static_cast<int32_t>(rng() % 5000);
    const int64_t budget = 4 * (1 + rng() % 100000);
    const Chunks plan = PlanChunks(visible, budget);
    ExpectPlanValid(visible, budget, plan);
    if (HasFatalFailure() || HasNonfatalFailure()) return;
  }
}

TEST(ChunkPlanTest, SingleRowsOverTheBudgetStandAlone) {
  const std::vector<int32_t> visible = {1000, 10, 10, 2000, 1};
  const Chunks plan = PlanChunks(visible, 4 * 500);
  ExpectPlanValid(visible, 4 * 500, plan);
  EXPECT_EQ(plan, (Chunks{{0, 1}, {1, 3}, {3, 4}, {4, 5}}));
}

TEST(ChunkPlanTest, BuildStepRowsPlansUnderItsBudget) {
  const std::vector<int32_t> old_pages, new_pages(64, 0);
  // 512 rows of a prefill seeing 1..512 entries, budget 64 KiB.
  const StepRows rows = BuildStepRows({{0, 512, &old_pages, &new_pages}}, 1, 64 << 10);
  ExpectPlanValid(rows.row_visible, 64 << 10, rows.chunks);
  EXPECT_GT(rows.chunks.size(), 1u);
}

// The check above must catch a planner that never splits: a one-chunk plan
// over rows whose logits exceed the budget is refused.
TEST(ChunkPlanTest, OneChunkPlanFailsTheCheck) {
  const std::vector<int32_t> visible(100, 1000);
  const Chunks never_split = {{0, 100}};
  EXPECT_NONFATAL_FAILURE(ExpectPlanValid(visible, 4 * 1000 * 10, never_split),
                          "chunk [0, 100)");
  // (EXPECT_FATAL_FAILURE's statement may only name statics.)
  static const std::vector<int32_t> kVisible(100, 1000);
  static const Chunks kGap = {{0, 10}, {11, 100}};
  EXPECT_FATAL_FAILURE(ExpectPlanValid(kVisible, 4 * 1000 * 10, kGap), "in order");
}

TEST(EvenChunksTest, Covers) {
  EXPECT_EQ(EvenChunks(10, 4), (Chunks{{0, 4}, {4, 8}, {8, 10}}));
  EXPECT_TRUE(EvenChunks(0, 4).empty());
}

TEST(ValidateStepRowsTest, NamesTheField) {
  const std::vector<int32_t> pages = {0, 1}, none;
  StepRows rows = BuildStepRows({{0, 20, &pages, &none}}, 1, INT64_MAX);
  PageLayout layout;
  layout.format = KvFormat::kFp8;
  layout.head_dim = 128;
  layout.page_entries = 16;
  EXPECT_TRUE(ValidateStepRows(layout, rows, 2).ok());
  const absl::Status oob = ValidateStepRows(layout, rows, 1);
  EXPECT_EQ(oob.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(oob.message().find("block_table[0][1]"), std::string::npos) << oob;
  rows.row_visible[3] = 21;
  const absl::Status vis = ValidateStepRows(layout, rows, 2);
  EXPECT_NE(vis.message().find("row_visible[3]"), std::string::npos) << vis;
}

}  // namespace
}  // namespace indexer

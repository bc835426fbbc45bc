// indexer_gpu_bench --trace's summary (tests/bench/trace_stats.h) on block
// records made from known timelines.
#include "tests/bench/trace_stats.h"

#include <cstdint>
#include <vector>

#include "gtest/gtest.h"

namespace indexer {
namespace bench {
namespace {

using namespace gpu;

// One block's record at 2 cycles a ns: it starts at `start_ns`; the math
// thread's first wait runs from +2 us to +3 us, its tiles stream 40 us, it
// ends 1 us after the last; the block ends `exit_after_us` after the math
// end.
struct Block {
  uint64_t start_ns;
  double exit_after_us = 0.5;
  uint64_t steady_wait_clk = 8000;  // after the first wait
  uint64_t copy_wait_clk = 20000;   // 0 with copy_end 0: not kept
  bool copy_kept = true;
  uint64_t tiles = 100;
  uint64_t end_wait_clk = 0;
};

void Put(const Block& b, int index, std::vector<uint64_t>& rec) {
  if (rec.size() < static_cast<size_t>(index + 1) * kTraceWords) rec.resize((index + 1) * kTraceWords, 0);
  uint64_t* r = rec.data() + index * kTraceWords;
  const uint64_t entry = 10000 + 7 * b.start_ns;  // each SM's counter has its own origin
  const uint64_t first_wait0 = entry + 4000, first = entry + 6000;
  const uint64_t last = first + 80000, end = last + 2000;
  r[kTraceEntryNs] = b.start_ns;
  r[kTraceEntryClk] = entry;
  r[kTraceFirstWaitInv] = ~first_wait0;
  r[kTraceFirstClkInv] = ~first;
  r[kTraceLastClk] = last;
  r[kTraceMathEndClk] = end;
  r[kTraceMathEndNs] = b.start_ns + (end - entry) / 2;
  r[kTraceExitNs] = r[kTraceMathEndNs] + static_cast<uint64_t>(b.exit_after_us * 1000);
  r[kTraceMathWaitClk] = (first - first_wait0) + b.steady_wait_clk;
  r[kTraceTiles] = b.tiles;
  r[kTraceCopyWaitClk] = b.copy_kept ? b.copy_wait_clk : 0;
  r[kTraceCopyEndClk] = b.copy_kept ? entry + 80000 : 0;
  r[kTraceSm] = static_cast<uint64_t>(index);
  // The end mark's wait (wgmma_ws): counted in the waits, kept apart too.
  r[kTraceMathWaitClk] += b.end_wait_clk;
  r[kTraceEndWaitClk] = b.end_wait_clk;
}

TEST(TraceStats, PartsOfOneLaunch) {
  std::vector<uint64_t> rec;
  Put({.start_ns = 1000}, 0, rec);
  Put({.start_ns = 1500, .exit_after_us = 2.5, .end_wait_clk = 3000}, 1, rec);
  Put({.start_ns = 1200, .end_wait_clk = 1500}, 2, rec);  // not a tile's wait
  const TraceStats s = SummarizeTrace(rec.data(), 3, 60.0);
  EXPECT_EQ(s.blocks, 3);
  EXPECT_DOUBLE_EQ(s.clock_ghz, 2.0);
  EXPECT_DOUBLE_EQ(s.fill_us, 3.0);        // start to the first tile: 6000 cycles
  EXPECT_DOUBLE_EQ(s.first_wait_us, 1.0);  // 2000 cycles
  EXPECT_DOUBLE_EQ(s.stream_us, 40.0);
  EXPECT_DOUBLE_EQ(s.drain_us, 1.0);
  // 8000 of 80000 in every block: the first wait and the end marks' left out.
  EXPECT_DOUBLE_EQ(s.math_wait_pct, 10.0);
  EXPECT_DOUBLE_EQ(s.copy_wait_pct, 25.0);  // 20000 of 80000
  EXPECT_DOUBLE_EQ(s.tiles, 100);
  EXPECT_DOUBLE_EQ(s.start_spread_us, 0.5);
  // Math ends 44 us after each start; block 1 ends at 1500 + 44000 + 2500.
  EXPECT_DOUBLE_EQ(s.span_us, 47.0);
  EXPECT_DOUBLE_EQ(s.outside_us, 13.0);
  // Ends: 45500, 45700, 48000 ns; the upper median 45700.
  EXPECT_DOUBLE_EQ(s.end_spread_us, 2.3);
  EXPECT_GT(s.timer_step_ns, 0);
  EXPECT_LE(s.timer_step_ns, 200);
}

TEST(TraceStats, BlocksWithoutWorkAndCopiesNotKept) {
  std::vector<uint64_t> rec;
  Put({.start_ns = 1000, .copy_kept = false}, 0, rec);
  rec.resize(3 * kTraceWords, 0);  // blocks 1 and 2 had no work: zero records
  Put({.start_ns = 2000, .copy_kept = false, .tiles = 0}, 3, rec);  // started, scored nothing
  const TraceStats s = SummarizeTrace(rec.data(), 4, 50.0);
  EXPECT_EQ(s.blocks, 1);
  EXPECT_DOUBLE_EQ(s.copy_wait_pct, -1);
  EXPECT_DOUBLE_EQ(s.start_spread_us, 0);
  EXPECT_DOUBLE_EQ(s.stream_us, 40.0);

  const TraceStats none = SummarizeTrace(rec.data() + kTraceWords, 2, 50.0);
  EXPECT_EQ(none.blocks, 0);
  EXPECT_DOUBLE_EQ(none.event_us, 50.0);
  EXPECT_DOUBLE_EQ(none.span_us, 0);
}

TEST(TraceStats, MedianOverLaunches) {
  std::vector<TraceStats> runs(3);
  runs[0].event_us = 10, runs[1].event_us = 30, runs[2].event_us = 20;
  runs[0].drain_us = 5, runs[1].drain_us = 1, runs[2].drain_us = 3;
  runs[0].copy_wait_pct = -1, runs[1].copy_wait_pct = -1, runs[2].copy_wait_pct = -1;
  runs[0].blocks = 132, runs[1].blocks = 130, runs[2].blocks = 131;
  runs[0].timer_step_ns = 64, runs[1].timer_step_ns = 32, runs[2].timer_step_ns = 0;
  const TraceStats m = MedianTrace(runs);
  EXPECT_DOUBLE_EQ(m.event_us, 20);
  EXPECT_DOUBLE_EQ(m.drain_us, 3);
  EXPECT_DOUBLE_EQ(m.copy_wait_pct, -1);
  EXPECT_EQ(m.blocks, 131);
  EXPECT_DOUBLE_EQ(m.timer_step_ns, 32);
}

}  // namespace
}  // namespace bench
}  // namespace indexer

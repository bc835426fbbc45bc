// indexer_gpu_bench --trace: one traced launch's block records
// (kernels/gpu/trace_record.h) summed up as where its time went. Host only,
// no GPU (trace_stats_test).
//
// The parts of a launch, each a median over its blocks unless named a
// spread:
//   outside       the bench's event time less the blocks' span (first start
//                 to last end, by %globaltimer): the launch and the events
//   start spread  the last block's start after the first's
//   fill          a block's start to its first tile ready (its Q, the
//                 first copies' latency; first wait: that wait alone)
//   stream        the first tile ready to the last scored
//   drain         the last tile scored to the block's math end (the wait
//                 for the end mark, the histogram flush)
//   end spread    the last block's end after the median block's
// and how the stream went: the math thread's waits for tiles after the
// first, the end mark's left out (% of stream: the bytes set the pace), the copy warp's waits for
// free slots (% of its life: the math sets it; -1 where not kept).
#pragma once

#include <algorithm>
#include <cstdint>
#include <vector>

#include "kernels/gpu/trace_record.h"
#include "tests/bench/median.h"

namespace indexer {
namespace bench {

struct TraceStats {
  int blocks = 0;            // records with a start and tiles
  double event_us = 0;       // the bench's event time of the launch
  double span_us = 0;        // first start to last end (%globaltimer)
  double outside_us = 0;     // event_us - span_us
  double start_spread_us = 0;
  double fill_us = 0;
  double first_wait_us = 0;
  double stream_us = 0;
  double drain_us = 0;
  double end_spread_us = 0;
  double math_wait_pct = 0;  // waits after the first, % of stream
  double copy_wait_pct = -1; // -1: the kernel keeps none
  double tiles = 0;          // the math thread's tiles
  double clock_ghz = 0;      // SM cycles per ns
  double timer_step_ns = 0;  // the smallest step seen between distinct %globaltimer values
};

// `records`: `blocks` records of gpu::kTraceWords words, as the launch left
// them in its zeroed buffer.
inline TraceStats SummarizeTrace(const uint64_t* records, int blocks, double event_us) {
  using namespace gpu;
  TraceStats s;
  s.event_us = event_us;
  // The records of blocks that started and scored tiles, each with its
  // clock's rate (cycles a ns, from its start and math end).
  std::vector<const uint64_t*> used;
  std::vector<double> ghz;
  std::vector<uint64_t> starts, ends, stamps;
  for (int b = 0; b < blocks; ++b) {
    const uint64_t* r = records + static_cast<int64_t>(b) * kTraceWords;
    if (r[kTraceEntryNs] == 0 || r[kTraceTiles] == 0 || r[kTraceMathEndNs] <= r[kTraceEntryNs]) continue;
    const double rate = static_cast<double>(r[kTraceMathEndClk] - r[kTraceEntryClk]) /
                        static_cast<double>(r[kTraceMathEndNs] - r[kTraceEntryNs]);
    if (!(rate > 0)) continue;
    used.push_back(r);
    ghz.push_back(rate);
    starts.push_back(r[kTraceEntryNs]);
    ends.push_back(r[kTraceExitNs]);
    stamps.insert(stamps.end(), {r[kTraceEntryNs], r[kTraceExitNs], r[kTraceMathEndNs]});
  }
  s.blocks = static_cast<int>(used.size());
  if (s.blocks == 0) return s;
  s.clock_ghz = Median(ghz);
  const double per_us = s.clock_ghz * 1e3;  // cycles a microsecond
  std::vector<double> fill, first_wait, stream, drain, math_wait, copy_wait, tiles;
  for (const uint64_t* r : used) {
    const uint64_t first_wait0 = ~r[kTraceFirstWaitInv], first = ~r[kTraceFirstClkInv];
    const uint64_t entry = r[kTraceEntryClk], last = r[kTraceLastClk], end = r[kTraceMathEndClk];
    fill.push_back(static_cast<double>(first - entry) / per_us);
    first_wait.push_back(static_cast<double>(first - first_wait0) / per_us);
    stream.push_back(static_cast<double>(last - first) / per_us);
    drain.push_back(static_cast<double>(end - last) / per_us);
    // The tiles' waits: less the first (the fill's) and the end mark's.
    const double steady_wait =
        static_cast<double>(r[kTraceMathWaitClk] - (first - first_wait0) - r[kTraceEndWaitClk]);
    math_wait.push_back(last > first ? 100.0 * steady_wait / static_cast<double>(last - first) : 0);
    if (r[kTraceCopyEndClk] > entry) {
      copy_wait.push_back(100.0 * static_cast<double>(r[kTraceCopyWaitClk]) /
                          static_cast<double>(r[kTraceCopyEndClk] - entry));
    }
    tiles.push_back(static_cast<double>(r[kTraceTiles]));
  }
  const uint64_t first_start = *std::min_element(starts.begin(), starts.end());
  const uint64_t last_start = *std::max_element(starts.begin(), starts.end());
  const uint64_t last_end = *std::max_element(ends.begin(), ends.end());
  std::vector<double> ends_d(ends.begin(), ends.end());
  s.span_us = static_cast<double>(last_end - first_start) / 1e3;
  s.outside_us = event_us - s.span_us;
  s.start_spread_us = static_cast<double>(last_start - first_start) / 1e3;
  s.end_spread_us = (static_cast<double>(last_end) - Median(ends_d)) / 1e3;
  s.fill_us = Median(fill);
  s.first_wait_us = Median(first_wait);
  s.stream_us = Median(stream);
  s.drain_us = Median(drain);
  s.math_wait_pct = Median(math_wait);
  s.copy_wait_pct = copy_wait.empty() ? -1 : Median(copy_wait);
  s.tiles = Median(tiles);
  std::sort(stamps.begin(), stamps.end());
  for (size_t i = 1; i < stamps.size(); ++i) {
    const uint64_t d = stamps[i] - stamps[i - 1];
    if (d > 0 && (s.timer_step_ns == 0 || static_cast<double>(d) < s.timer_step_ns)) s.timer_step_ns = static_cast<double>(d);
  }
  return s;
}

// The medians of each part over several launches of one shape.
inline TraceStats MedianTrace(const std::vector<TraceStats>& runs) {
  TraceStats m;
  if (runs.empty()) return m;
  auto med = [&](double TraceStats::*f) {
    std::vector<double> v;
    for (const TraceStats& r : runs) v.push_back(r.*f);
    return Median(v);
  };
  std::vector<double> nb;
  for (const TraceStats& r : runs) nb.push_back(r.blocks);
  m.blocks = static_cast<int>(Median(nb));
  for (double TraceStats::*f :
       {&TraceStats::event_us, &TraceStats::span_us, &TraceStats::outside_us, &TraceStats::start_spread_us,
        &TraceStats::fill_us, &TraceStats::first_wait_us, &TraceStats::stream_us, &TraceStats::drain_us,
        &TraceStats::end_spread_us, &TraceStats::math_wait_pct, &TraceStats::copy_wait_pct, &TraceStats::tiles,
        &TraceStats::clock_ghz}) {
    m.*f = med(f);
  }
  // The finest step any launch saw.
  for (const TraceStats& r : runs) {
    if (r.timer_step_ns > 0 && (m.timer_step_ns == 0 || r.timer_step_ns < m.timer_step_ns)) m.timer_step_ns = r.timer_step_ns;
  }
  return m;
}

}  // namespace bench
}  // namespace indexer

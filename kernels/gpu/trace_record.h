// The bench's kernel timeline (indexer_gpu_bench --trace): the layout of
// one block's record. Plain constants, so that the bench's host summary
// (tests/bench/trace_stats.h) and its unit test need nothing else.
//
// Where a persistent kernel's time goes between the bench's events: per
// block, when it started and ended (the device's nanosecond timer,
// comparable across SMs), when its first K tile was ready and its last one
// scored, how long its math side waited for tiles and its copy side for free
// ring slots (the SM's cycle counter). wgmma_ws, wgmma_mxfp4 and block_stream
// write it where LogitsParams::trace / BlockScoreParams::trace is set: the
// bench only (GpuBackend::set_bench_trace); null in production, where it
// costs a predicate a tile. Block b's record is words [b * kTraceWords,
// + kTraceWords) of the buffer, zeroed before the launch, for b <
// trace_blocks; a block that had no work leaves its record zero. The math
// side is one thread: the first math warp's lane 0 (block_stream: the first
// group's first warp, which also fetches its pages).
#pragma once

namespace indexer {
namespace gpu {

enum TraceWord : int {
  kTraceEntryNs = 0,   // %globaltimer at the block's start (thread 0)
  kTraceExitNs,        // the block's end: the latest of its roles' ends
  kTraceEntryClk,      // clock64 at the start (thread 0)
  kTraceFirstWaitInv,  // ~ the math thread's first wait's start (clock64)
  kTraceFirstClkInv,   // ~ its end: the first tile ready
  kTraceLastClk,       // the math thread's last tile scored
  kTraceMathEndClk,    // its end (after the histogram flush)
  kTraceMathEndNs,     // the same moment by %globaltimer (gives the clock's rate)
  kTraceMathWaitClk,   // its cycles waiting for tiles, the first wait included
  kTraceTiles,         // its tiles (block_stream: pages)
  kTraceCopyWaitClk,   // the copy warp's cycles waiting for free slots (0: not kept)
  kTraceCopyEndClk,    // the copy warp's end (0: not kept)
  kTraceSm,            // %smid
  kTraceLastWaitClk,   // the math thread's latest wait (scratch for the next word)
  kTraceEndWaitClk,    // its wait for the end mark, in kTraceMathWaitClk but not a
                       // tile's (wgmma_ws: the copy warp's end of the share; else 0)
  kTraceWords = 16,
};

}  // namespace gpu
}  // namespace indexer

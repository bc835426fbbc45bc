// The bench's kernel timeline on sm_90 (trace_record.h: TraceWord): the
// timers and the writes of a block's record. Every helper takes the block's
// record, null in all but the record's one thread and wherever the launch is
// not traced (production: then each is one predicate); the timed waits also
// take whether the launch is traced, the same in every lane.
#pragma once

#include <cstdint>

#include "kernels/gpu/params.h"

namespace indexer {
namespace gpu {

#if INDEXER_GPU_WGMMA
// The device's nanosecond timer, the same on every SM.
__device__ __forceinline__ uint64_t TraceNs() {
  uint64_t t;
  asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(t));
  return t;
}
// The SM's cycle counter.
__device__ __forceinline__ uint64_t TraceClk() {
  uint64_t t;
  asm volatile("mov.u64 %0, %%clock64;" : "=l"(t));
  return t;
}
__device__ __forceinline__ uint32_t TraceSmId() {
  uint32_t s;
  asm volatile("mov.u32 %0, %%smid;" : "=r"(s));
  return s;
}

// This block's record, or null (not traced, or past the buffer). Called at
// each use from the kernel's parameters (a constant-bank test), so that an
// untraced launch keeps no register for it across its loops.
// The block index is read by a volatile move, which the compiler cannot hoist:
// a hoisted record address held registers across the kernels' loops (ptxas:
// +2 to +10 registers, an 8-byte spill at MXFP4 H 64 next_n 2).
__device__ __forceinline__ uint64_t* TraceRecord(uint64_t* trace, int32_t blocks) {
  if (trace == nullptr) return nullptr;
  uint32_t b;
  asm volatile("mov.u32 %0, %%ctaid.x;" : "=r"(b));
  return static_cast<int32_t>(b) < blocks ? trace + static_cast<int64_t>(b) * kTraceWords : nullptr;
}

// The block's start (one thread).
__device__ __forceinline__ void TraceEntry(uint64_t* rec) {
  if (rec == nullptr) return;
  rec[kTraceEntryClk] = TraceClk();
  rec[kTraceEntryNs] = TraceNs();
  rec[kTraceSm] = TraceSmId();
}

// One role's end: the block's end is the latest.
__device__ __forceinline__ void TraceExit(uint64_t* rec) {
  if (rec == nullptr) return;
  atomicMax(reinterpret_cast<unsigned long long*>(rec + kTraceExitNs),
            static_cast<unsigned long long>(TraceNs()));
}

// Fire-and-forget updates (reductions, no reply awaited): the traced
// thread's loop keeps no trace state in registers.
__device__ __forceinline__ void TraceAdd(uint64_t* w, uint64_t v) {
  atomicAdd(reinterpret_cast<unsigned long long*>(w), static_cast<unsigned long long>(v));
}
__device__ __forceinline__ void TraceMin(uint64_t* w, uint64_t v) {  // stored inverted
  atomicMax(reinterpret_cast<unsigned long long*>(w), static_cast<unsigned long long>(~v));
}

// A wait, timed where the launch is traced: the math side's waits add to
// kTraceMathWaitClk, the first one included (its start and end are the
// smallest: kTraceFirstWaitInv, kTraceFirstClkInv, stored inverted, so the
// host takes it out); the copy warp's to kTraceCopyWaitClk. `traced` is
// the launch's (p.trace != nullptr), the same in every thread: every lane
// of a warp takes the same branch around the wait, and only the record's
// own thread (rec not null) writes; the warp then meets again. (A wait in
// a branch of one lane leaves its warp unconverged before the next wgmma /
// mma.sync, whose .aligned forms need the whole warp: the likely cause of
// the first traced bench's hang, results s40.) Untraced, the wait
// is its own branch, so that no clock value is live across it.
template <class Wait, class Record>
__device__ __forceinline__ void TraceTimedWait(bool traced, uint64_t* rec, Wait&& wait, Record&& record) {
  if (!traced) {
    wait();
    return;
  }
  const uint64_t c0 = TraceClk();
  wait();
  const uint64_t c1 = TraceClk();
  if (rec != nullptr) record(rec, c0, c1);
  __syncwarp();  // the warp whole again before its next aligned instruction
}
template <class Wait>
__device__ __forceinline__ void TraceMathWait(bool traced, uint64_t* rec, Wait&& wait) {
  TraceTimedWait(traced, rec, wait, [](uint64_t* r, uint64_t c0, uint64_t c1) {
    TraceAdd(r + kTraceMathWaitClk, c1 - c0);
    TraceMin(r + kTraceFirstWaitInv, c0);
    TraceMin(r + kTraceFirstClkInv, c1);
    r[kTraceLastWaitClk] = c1 - c0;
  });
}
template <class Wait>
__device__ __forceinline__ void TraceCopyWait(bool traced, uint64_t* rec, Wait&& wait) {
  TraceTimedWait(traced, rec, wait,
                 [](uint64_t* r, uint64_t c0, uint64_t c1) { TraceAdd(r + kTraceCopyWaitClk, c1 - c0); });
}
// The math thread's last wait was for the end mark, not a tile: kept apart
// (kTraceEndWaitClk), so the host takes it out of the tiles' waits.
__device__ __forceinline__ void TraceEndMark(uint64_t* rec) {
  if (rec != nullptr) rec[kTraceEndWaitClk] = rec[kTraceLastWaitClk];
}
// The math side's tile scored (`traced` as for the waits: the warp meets
// again after its one writing lane, before the next tile's aligned
// instructions).
__device__ __forceinline__ void TraceScored(bool traced, uint64_t* rec) {
  if (!traced) return;
  if (rec != nullptr) {
    TraceAdd(rec + kTraceTiles, 1);
    rec[kTraceLastClk] = TraceClk();
  }
  __syncwarp();
}
// The math side's last tile scored, with its count, at once (kernels whose
// loop has no room for a mark a tile).
__device__ __forceinline__ void TraceScoredAll(uint64_t* rec, int32_t tiles) {
  if (rec == nullptr) return;
  rec[kTraceTiles] = static_cast<uint64_t>(tiles);
  rec[kTraceLastClk] = TraceClk();
}
// The math side's end.
__device__ __forceinline__ void TraceMathEnd(uint64_t* rec) {
  if (rec == nullptr) return;
  rec[kTraceMathEndClk] = TraceClk();
  rec[kTraceMathEndNs] = TraceNs();
  TraceExit(rec);
}
// The copy warp's end.
__device__ __forceinline__ void TraceCopyEnd(uint64_t* rec) {
  if (rec == nullptr) return;
  rec[kTraceCopyEndClk] = TraceClk();
  TraceExit(rec);
}
#endif  // INDEXER_GPU_WGMMA

}  // namespace gpu
}  // namespace indexer

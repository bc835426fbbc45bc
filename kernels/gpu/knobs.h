// The gpu backend's environment knobs, every one of them, read once per
// process (the first Knobs() call) and in one place. They exist for A/B runs
// and experiments on a device: production sets none of them, and the daemon
// logs the ones that are set (KnobsSet) beside its device at start.
//
//   INDEXER_GPU_WGMMA_WS=0           FP8: the serial wgmma kernel instead of
//                                    the warp-specialized one (the consumer's
//                                    gather walk too: wgmma_gather)
//   INDEXER_GPU_WGMMA_MXFP4=0        MXFP4: mma.sync instead of wgmma
//   INDEXER_GPU_TOPK_FUSE=0          wgmma_ws builds no top-k histogram
//   INDEXER_GPU_WS_EVICT_FIRST=0     wgmma_ws (decode steps whose logits
//                                    fit the L2: it never hints K a step
//                                    re-reads, nor past the L2) and
//                                    block_stream read K without the L2
//                                    evict-first hint; =2: wgmma_ws hints
//                                    decode steps past the L2 too (the
//                                    rule before 6743f68, for its A/B)
//   INDEXER_GPU_WS_UNIT=N            wgmma_ws work units of N entries (a
//                                    multiple of 64; else the planner's rule)
//   INDEXER_GPU_WS_BLOCKS_PER_SM=N   caps wgmma_ws's blocks per SM
//   INDEXER_GPU_WS_TAIL=0..50        wgmma_ws's claimed tail, percent of
//                                    every launch's units (plan.h:
//                                    TailRule; unset: 20 % where groups
//                                    have two or more rows and every block
//                                    keeps 24 units, else none)
//   INDEXER_GPU_MXFP4_WARPGROUPS=N   wgmma_mxfp4's math warpgroups: 3 or 4
//                                    for one row (default 4 at H 64's dense
//                                    walk, else 3), 2 or 3 for two (default 3)
//   INDEXER_GPU_MFMA_MODEL=gfx942|gfx950  CUDA: the default logits choice runs
//                                    the MFMA kernels through the instruction
//                                    model
//   INDEXER_GPU_BLOCK_STREAM=0..5   block_stream's launch shape (default 5,
//                                    2 for Hi > 4)
//   INDEXER_GPU_BLOCK_TMA=0          block_stream copies whole pages (no
//                                    tensor map, no swizzle) on linear pages
//   INDEXER_GPU_BLOCK_PREFETCH=1     block_stream: each group asks the L2
//                                    for the page it copies next an item
//                                    ahead (cp.async.bulk.prefetch.L2), a
//                                    second page in flight beside its ring
//   INDEXER_GPU_TOPK_BLOCKS_PER_SM=1|3|4  the cooperative top-k's stage B
//                                    register cap (else by the launch's size)
//   INDEXER_GPU_TOPK_SLICE_BLOCKS=N  the cooperative top-k's slices: about N
//                                    blocks per SM over the launch (default 2)
//   INDEXER_GPU_TOPK_ROW_THREADS=512|1024  the by-rows top-k's block size
//                                    (else 1024 up to one row per SM)
//   INDEXER_GPU_LOGITS_PDL=1         wgmma_ws lets the top-k's blocks be
//                                    placed while its own tail runs
//                                    (programmatic dependent launch)
//   INDEXER_GPU_SPLIT_TIMING=1       an event between a layer's logits and
//                                    its top-k, each timed alone (LayerTimings
//                                    logits_us and topk_us); costs the top-k's
//                                    launch ~3 us a layer (else one span,
//                                    reported as logits_us)
//   INDEXER_GPU_LOGITS_MB=N          the logits workspace (default 1024 MiB)
#pragma once

#include <cstdint>
#include <string>

namespace indexer {
namespace gpu {

struct GpuKnobs {
  bool wgmma_ws = true;
  bool wgmma_mxfp4 = true;
  bool topk_fuse = true;
  int32_t ws_evict_first = 1;  // 0 never, 1 the launcher's rule, 2 past the L2 too
  int32_t ws_unit_entries = 0;   // 0: the planner's rule
  int32_t ws_blocks_per_sm = 0;  // 0: as many as fit
  int32_t ws_tail_percent = -1;  // -1 unset: plan.h's rule; 0: every unit split evenly
  int32_t mxfp4_warpgroups = 0;  // 0: the default sizes
  int32_t mfma_model_arch = 0;   // 0, 942 or 950
  int32_t block_stream_shape = -1;  // -1: the kernel's default
  bool block_tma = true;
  bool block_prefetch = false;
  int32_t topk_blocks_per_sm = 0;   // 0: TopkEmitCap's rule; else 1, 3 or 4
  int32_t topk_slice_blocks = 2;    // PlanTopkSplit's blocks per SM (1..8)
  bool logits_pdl = false;
  bool split_timing = false;  // an event between a layer's logits and top-k kernels
  int32_t topk_row_threads = 0;  // the by-rows top-k's block: 0 PlanTopkSplit's rule, 512 or 1024
  int64_t logits_mb = 1024;
};

// The process's knobs (parsed on first use; unparsable values keep the
// default).
const GpuKnobs& Knobs();
// "NAME=value, ..." of the knobs set in the environment, "" when none.
std::string KnobsSet();

}  // namespace gpu
}  // namespace indexer

// The candidate consumer's gather walk (LogitsParams::gather_*): its kernel
// choice (logits_dispatch.cc) and the sm_90 kernels it picks from. Only the
// pool's slots are scored, their logits written at the slots (compact rows).
#pragma once

#include "absl/status/status.h"
#include "kernels/gpu/gpu_compat.h"
#include "kernels/gpu/params.h"

namespace indexer {
namespace gpu {

// True when a consumer of `p`'s layout, H and pool blocks (gather_block;
// groups of one row) can gather on this device: FP8 e4m3fn on the sm_90a
// wgmma kernels, H 16, 32 or 64 (any pool blocks); MXFP4 on the sm_90a
// MXFP4 kernel (linear pages of a multiple of 64 entries, pool blocks of a
// multiple of 8 entries, H 16, 32 or 64). The length gate asks this before
// it picks the gather walk.
bool GatherLogitsSupported(const LogitsParams& p, int cc_major, int cc_minor);

// Runs the gather walk for `p` (gather_* set, groups of one row):
// "wgmma_ws_gather" (the warp-specialized kernel, whole 8-entry chunks by
// the bulk copy engine) where the pool has a tensor map (use_tma) and
// `rows8`, its map of 8-entry boxes, is given, the pool blocks hold a
// multiple of 8 entries and INDEXER_GPU_WGMMA_WS is not 0; else
// "wgmma_gather" (the serial cp.async kernel, entry by entry: any layout and
// block size it takes). MXFP4: "wgmma_mxfp4_gather" (the MXFP4
// warp-specialized kernel, whole 8-entry chunks by 16-byte cp.async of
// the producer warp; no tensor map). `which` gets the name.
absl::Status LaunchGatherLogits(const LogitsParams& p, const TensorMap* rows8, int cc_major, int cc_minor,
                                Stream stream, const char** which);

// ---- hopper/logits_wgmma_ws.cu (CUDA builds only; named only under
// kHopperPaths) ---------------------------------------------------------------
bool WgmmaWsGatherSupported(const LogitsParams& p);
absl::Status LaunchDenseLogitsWgmmaWsGather(const LogitsParams& p, const TensorMap& rows8, Stream stream);

// ---- hopper/logits_mxfp4_ws.cu (CUDA builds only; named only under
// kHopperPaths) ---------------------------------------------------------------
// Layout, H and pool blocks only (the length gate's probe has no Q).
bool WgmmaMxfp4GatherSupported(const LogitsParams& p, int cc_major, int cc_minor);
absl::Status LaunchDenseLogitsWgmmaMxfp4Gather(const LogitsParams& p, Stream stream);

}  // namespace gpu
}  // namespace indexer

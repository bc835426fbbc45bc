#include "kernels/gpu/knobs.h"

#include <cstdlib>
#include <cstring>

#include "absl/strings/str_cat.h"

namespace indexer {
namespace gpu {
namespace {

constexpr const char* kNames[] = {
    "INDEXER_GPU_WGMMA_WS",        "INDEXER_GPU_WGMMA_MXFP4",      "INDEXER_GPU_TOPK_FUSE",
    "INDEXER_GPU_WS_EVICT_FIRST",  "INDEXER_GPU_WS_UNIT",          "INDEXER_GPU_WS_BLOCKS_PER_SM",
    "INDEXER_GPU_WS_TAIL",
    "INDEXER_GPU_MXFP4_WARPGROUPS", "INDEXER_GPU_MFMA_MODEL",      "INDEXER_GPU_LOGITS_MB",
    "INDEXER_GPU_BLOCK_STREAM",    "INDEXER_GPU_BLOCK_TMA",        "INDEXER_GPU_BLOCK_PREFETCH",
    "INDEXER_GPU_TOPK_BLOCKS_PER_SM",
    "INDEXER_GPU_TOPK_SLICE_BLOCKS",
    "INDEXER_GPU_LOGITS_PDL",      "INDEXER_GPU_TOPK_ROW_THREADS", "INDEXER_GPU_SPLIT_TIMING"};

// On unless set to a number that is 0.
bool Switch(const char* name) {
  const char* v = std::getenv(name);
  return v == nullptr || *v == '\0' || std::atoi(v) != 0;
}

int64_t Number(const char* name) {
  const char* v = std::getenv(name);
  return v == nullptr ? 0 : std::atoll(v);
}

GpuKnobs Read() {
  GpuKnobs k;
  k.wgmma_ws = Switch("INDEXER_GPU_WGMMA_WS");
  k.wgmma_mxfp4 = Switch("INDEXER_GPU_WGMMA_MXFP4");
  k.topk_fuse = Switch("INDEXER_GPU_TOPK_FUSE");
  if (const char* v = std::getenv("INDEXER_GPU_WS_EVICT_FIRST"); v != nullptr && *v != '\0') {
    const int64_t mode = std::atoll(v);
    k.ws_evict_first = mode == 0 ? 0 : mode == 2 ? 2 : 1;
  }
  const int64_t unit = Number("INDEXER_GPU_WS_UNIT");
  k.ws_unit_entries = unit >= 64 && unit % 64 == 0 && unit <= (1 << 20) ? static_cast<int32_t>(unit) : 0;
  const int64_t per_sm = Number("INDEXER_GPU_WS_BLOCKS_PER_SM");
  k.ws_blocks_per_sm = per_sm > 0 && per_sm <= 64 ? static_cast<int32_t>(per_sm) : 0;
  // Unset or not a whole number 0..50: plan.h's rule.
  if (const char* v = std::getenv("INDEXER_GPU_WS_TAIL"); v != nullptr && *v != '\0') {
    char* end = nullptr;
    const long long ws_tail = std::strtoll(v, &end, 10);
    if (*end == '\0' && ws_tail >= 0 && ws_tail <= 50) k.ws_tail_percent = static_cast<int32_t>(ws_tail);
  }
  const int64_t wg = Number("INDEXER_GPU_MXFP4_WARPGROUPS");
  k.mxfp4_warpgroups = wg > 0 && wg <= 8 ? static_cast<int32_t>(wg) : 0;
  if (const char* v = std::getenv("INDEXER_GPU_MFMA_MODEL"); v != nullptr) {
    if (std::strcmp(v, "gfx942") == 0) k.mfma_model_arch = 942;
    if (std::strcmp(v, "gfx950") == 0) k.mfma_model_arch = 950;
  }
  if (const char* v = std::getenv("INDEXER_GPU_BLOCK_STREAM"); v != nullptr && *v != '\0') {
    const int64_t shape = std::atoll(v);
    if (shape >= 0 && shape <= 16) k.block_stream_shape = static_cast<int32_t>(shape);
  }
  k.block_tma = Switch("INDEXER_GPU_BLOCK_TMA");
  k.block_prefetch = Number("INDEXER_GPU_BLOCK_PREFETCH") != 0;
  const int64_t cap = Number("INDEXER_GPU_TOPK_BLOCKS_PER_SM");
  k.topk_blocks_per_sm = cap == 1 || cap == 3 || cap == 4 ? static_cast<int32_t>(cap) : 0;
  const int64_t slice_blocks = Number("INDEXER_GPU_TOPK_SLICE_BLOCKS");
  if (slice_blocks >= 1 && slice_blocks <= 8) k.topk_slice_blocks = static_cast<int32_t>(slice_blocks);
  k.logits_pdl = Number("INDEXER_GPU_LOGITS_PDL") != 0;
  k.split_timing = Number("INDEXER_GPU_SPLIT_TIMING") != 0;
  const int64_t row_threads = Number("INDEXER_GPU_TOPK_ROW_THREADS");
  if (row_threads == 512 || row_threads == 1024) k.topk_row_threads = static_cast<int32_t>(row_threads);
  const int64_t mb = Number("INDEXER_GPU_LOGITS_MB");
  if (mb > 0) k.logits_mb = mb;
  return k;
}

}  // namespace

const GpuKnobs& Knobs() {
  static const GpuKnobs knobs = Read();
  return knobs;
}

std::string KnobsSet() {
  std::string out;
  for (const char* name : kNames) {
    const char* v = std::getenv(name);
    if (v == nullptr) continue;
    absl::StrAppend(&out, out.empty() ? "" : ", ", name, "=", v);
  }
  return out;
}

}  // namespace gpu
}  // namespace indexer

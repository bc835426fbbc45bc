// Kernel parameter structs and host launchers of the gpu backend. Plain
// types only, so host files include this without a device compiler. Every
// launcher enqueues on `stream`, checks the launch and returns its status.
#pragma once

#include <cstdint>

#include "absl/status/status.h"
#include "kernels/format/page_layout.h"
#include "kernels/gpu/gpu_compat.h"
#include "kernels/gpu/plan.h"

namespace indexer {
namespace gpu {

// Device copies of a step's geometry (StepRows), shared by its layers.
struct DeviceStepRows {
  int32_t num_seqs;
  int32_t num_rows;
  int32_t max_pages;
  const int32_t* block_table;   // [num_seqs, max_pages] page, -1 past end
  const int32_t* seq_old;       // [num_seqs] entries before the step
  const int32_t* seq_k_begin;   // [num_seqs + 1] first K row per sequence
  const int32_t* row_visible;   // [num_rows] n_r
  const LogitsGroup* groups;    // [plan groups]
  const LogitsUnit* units;      // [plan units]
};

// ---- K write ---------------------------------------------------------------
enum class KSource : int32_t { kFloat32 = 0, kBf16 = 1, kQuantized = 2 };

struct WriteParams {
  PageLayout layout;
  uint8_t* pool;           // the layer's pool, page-contiguous
  DeviceStepRows step;
  int32_t entry_base;      // first K row of this launch (staged in pieces)
  int32_t num_entries;     // K rows of this launch
  KSource source;
  bool ue8m0;
  // kFloat32: [n, D] fp32; kBf16: [n, D] bf16 bits; kQuantized: [n, VB + SB]
  // linear entries; row 0 is K row entry_base.
  const void* src;
};

absl::Status LaunchWriteEntries(const WriteParams& p, Stream stream);

// ---- dense logits ----------------------------------------------------------
struct LogitsParams {
  PageLayout layout;
  const uint8_t* pool;
  DeviceStepRows step;
  int32_t unit_begin;        // the sub-chunk's units [unit_begin, unit_end)
  int32_t unit_end;
  int32_t row_base;          // first step row of the sub-chunk
  int32_t num_heads;         // H
  int32_t max_group_rows;    // largest group (sizes shared memory)
  const uint8_t* q_values;   // [rows, H, VB] e4m3 / packed e2m1 (sub-chunk)
  const uint8_t* q_scales;   // [rows, H, D/32] e8m0 (MXFP4), else null
  const float* weights;      // [rows, H] fp32
  float* logits;             // [rows, stride]; row r valid on [0, n_r)
  int64_t stride;
};

// Tensor-core path when the device, layout and H allow it, else portable.
// `which` (may be null) gets "mma" or "portable".
absl::Status LaunchDenseLogits(const LogitsParams& p, int cc_major,
                               int cc_minor, Stream stream,
                               const char** which = nullptr);
// The portable kernel alone (any layout, H, D; HIP and CUDA).
absl::Status LaunchDenseLogitsPortable(const LogitsParams& p, Stream stream);
// True when LaunchDenseLogitsMma accepts `p` on a device of this capability.
bool MmaLogitsSupported(const LogitsParams& p, int cc_major, int cc_minor);
absl::Status LaunchDenseLogitsMma(const LogitsParams& p, Stream stream);

// ---- top-k -----------------------------------------------------------------
struct TopkParams {
  const float* logits;       // [rows, stride] fp32
  int64_t stride;
  const int32_t* row_visible;  // [rows] n_r (device, sub-chunk rows)
  int32_t num_rows;
  int32_t topk;
  int32_t* out;              // [rows, topk] int32 device, -1 = no entry
  // Split of long rows: `slices` slices of `slice_len` entries each select
  // their own top-k into the candidate buffers ([rows, slices, topk]), then
  // one block per row selects from the candidates. slices == 1: no split.
  int32_t slices;
  int32_t slice_len;
  uint32_t* cand_keys;
  int32_t* cand_pos;
};

// Entries a top-k block keeps in shared memory; slices are never longer.
inline constexpr int32_t kTopkCache = 8192;

// Chooses the split for `num_rows` rows of up to `max_visible` entries on
// `num_sms` multiprocessors with room for `cand_capacity` candidates.
void PlanTopkSplit(int32_t num_rows, int32_t max_visible, int32_t topk,
                   int32_t num_sms, int64_t cand_capacity, TopkParams* p);
absl::Status LaunchTopk(const TopkParams& p, Stream stream);

}  // namespace gpu
}  // namespace indexer

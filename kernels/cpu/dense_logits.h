// Internals of the cpu token paths (SPEC §5): the work plan of one row chunk,
// the logits of one work unit, for the dense walk and for a gathered
// candidate pool (bit-identical values), and the K decode the block path
// shares. Used by the cpu backend's sources only.
#pragma once

#include <cstdint>
#include <vector>

#include "kernels/backend.h"
#include "kernels/cpu/cpu_internal.h"
#include "kernels/format/page_layout.h"

namespace indexer {
namespace cpu_internal {

// Entries decoded and scored together (columns of a decoded K block).
inline constexpr int kEntryBlock = 32;

// Decode entries of sequence `seq` into kt: [D, kEntryBlock] fp32 (column j
// = one entry, columns n.. zeroed) and kscale: [kEntryBlock] (the FP8
// entry scale, 1 for MXFP4 whose block scales are folded into kt).
// DecodeKRun: entries [e0, e0 + n); DecodeKList: entries[0, n).
// block_scale: [D / 32] scratch. REQUIRES: n <= kEntryBlock, the pages
// validated against the pool.
void DecodeKRun(const PageLayout& layout, const uint8_t* pool,
                const StepRows& rows, int32_t seq, int32_t e0, int32_t n,
                float* kt, float* kscale, float* block_scale);
void DecodeKList(const PageLayout& layout, const uint8_t* pool,
                 const StepRows& rows, int32_t seq, const int32_t* entries,
                 int32_t n, float* kt, float* kscale, float* block_scale);

// One unit of logits work: rows [row_begin, row_end) of sequence `seq`, all
// in the current chunk, over entries [e_begin, e_end). Each row only writes
// its entries below its own row_visible.
struct LogitsTask {
  int32_t seq;
  int32_t row_begin;
  int32_t row_end;
  int32_t e_begin;
  int32_t e_end;
};

// Splits rows [row_begin, row_end) into tasks: rows of one sequence share
// the K they read, so a task groups up to a few rows of one sequence and a
// range of entries. Long rows are split over entries so that a single row
// (batch 1, 128k entries) keeps every core busy.
std::vector<LogitsTask> PlanLogitsTasks(const StepRows& rows,
                                        int32_t row_begin, int32_t row_end);

struct LogitsParams {
  const PageLayout* layout;
  const uint8_t* pool;       // the layer's K pool
  const StepRows* rows;
  const QInput* q;           // [rows, H, VB] values, scales, [rows, H] weights
  int32_t chunk_row_begin;   // first row of the chunk
  const int64_t* row_offset; // [chunk rows] start of each row in `logits`
  float* logits;             // [sum of row_visible over the chunk] fp32
};

// Computes logits[row_offset[r - chunk_row_begin] + e] for every row r of
// the task and every e in [e_begin, min(e_end, row_visible[r])).
// REQUIRES: every page it reads was validated against the pool.
// Thread safety: tasks write disjoint logits; scratch is thread-local.
void RunLogitsTask(const LogitsParams& p, const LogitsTask& task);

// One unit of gathered consumer work: pool slots [slot_begin, slot_end) of
// row `row` (CandidatePool's slot numbering).
struct GatherTask {
  int32_t row;
  int32_t slot_begin;
  int32_t slot_end;
};

// Tasks covering row_offset[i + 1] - row_offset[i] slots of each row
// row_begin + i, long rows split so that one row keeps every core busy.
std::vector<GatherTask> PlanGatherTasks(const std::vector<int64_t>& row_offset,
                                        int32_t row_begin);

struct GatherParams {
  const PageLayout* layout;
  const uint8_t* pool;         // the layer's K pool
  const StepRows* rows;
  const QInput* q;
  const CandidatePool* cands;  // the rows' candidate pools
  int32_t chunk_row_begin;     // first row of the chunk
  const int64_t* row_offset;   // [chunk rows] start of each row in `logits`
  float* logits;               // [sum of gathered slots] fp32, slot order
};

// logits[row_offset[r - chunk_row_begin] + j] = the dense logit of the
// entry in pool slot j of row r (bit-identical to RunLogitsTask's), for j
// in [slot_begin, slot_end). Thread safety: as RunLogitsTask.
void RunGatherTask(const GatherParams& p, const GatherTask& task);

}  // namespace cpu_internal
}  // namespace indexer

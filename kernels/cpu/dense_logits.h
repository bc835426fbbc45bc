// Internals of the cpu dense token path (SPEC §5): the work plan of one row
// chunk and the logits of one work unit. Used by cpu_backend.cc only.
#pragma once

#include <cstdint>
#include <vector>

#include "kernels/backend.h"
#include "kernels/format/page_layout.h"

namespace indexer {
namespace cpu_internal {

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

}  // namespace cpu_internal
}  // namespace indexer

// Host planning of one step for the gpu backend (SPEC §6: per-step metadata
// is built once per step and shared by all its layers). Planning stays apart
// from the compute kernels: the server already holds the row lengths on the
// host, so the plan is one O(rows) host pass that travels to the device with
// the step's other metadata in a single copy.
//
// The plan cuts the step's rows into sub-chunks (the server's logits-budget
// chunks, cut again so a chunk's logits, Q and output fit the backend's
// preallocated workspace), groups the rows of a sub-chunk into row groups
// that share one sequence's K (a decode sequence's next_n rows, or up to
// kMaxGroupRows consecutive prefill rows), and splits every group's entry
// range into work units of about equal size so that long and short rows
// spread evenly over all multiprocessors.
#pragma once

#include <cstdint>
#include <vector>

#include "absl/status/statusor.h"
#include "kernels/backend.h"

namespace indexer {
namespace gpu {

// Rows of one sequence that read the same K entries together.
inline constexpr int32_t kMaxGroupRows = 4;

struct LogitsGroup {
  int32_t seq;        // sequence (block table row)
  int32_t row_begin;  // first row (step row index)
  int32_t num_rows;   // 1..kMaxGroupRows
  int32_t extent;     // max row_visible over the group's rows
};

// Entries [e_begin, e_end) of group `group`, e_end <= the group's extent.
struct LogitsUnit {
  int32_t group;
  int32_t e_begin;
  int32_t e_end;
  int32_t seq;  // the group's sequence: a K producer needs no group load
};

struct SubChunk {
  int32_t row_begin, row_end;    // step rows
  int32_t unit_begin, unit_end;  // into StepPlan::units
  int32_t max_visible;           // max row_visible over the rows
  int64_t stride;                // logits row stride (floats), >= max_visible
  int32_t max_group_rows;        // largest group of the sub-chunk
};

struct PlanLimits {
  int64_t logits_floats;  // workspace capacity for one sub-chunk's logits
  int32_t max_rows;       // rows a sub-chunk may hold (Q and output staging)
  int32_t num_sms;        // multiprocessors to balance the units over
  // Entries per unit (a multiple of 64); 0 = about four units per SM. The
  // persistent wgmma kernel balances by range, so it wants small units.
  int32_t unit_entries = 0;
};

struct StepPlan {
  std::vector<LogitsGroup> groups;
  std::vector<LogitsUnit> units;
  std::vector<SubChunk> chunks;
};

// REQUIRES: `rows` validated (ValidateStepRows). RESOURCE_EXHAUSTED when a
// single row's logits do not fit the workspace.
absl::StatusOr<StepPlan> PlanStep(const StepRows& rows,
                                  const PlanLimits& limits);

}  // namespace gpu
}  // namespace indexer

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
#include "kernels/geometry/step_geometry.h"

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
// The group's sequence and rows and the unit's first page ride along, so a
// kernel's first K copy and Q load wait on one metadata load, not a chain.
struct LogitsUnit {
  int32_t group;
  int32_t e_begin;
  int32_t e_end;
  int32_t seq;        // the group's sequence
  int32_t row_begin;  // the group's first row (step row index)
  int32_t num_rows;   // the group's rows
  int32_t page0;      // physical page of entry e_begin (set by the backend; -1 unset)
  int32_t pad = 0;
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
  // Entries per unit (a multiple of 64); 0 = about four units per SM;
  // kWsUnits = the persistent wgmma kernel's rule (WsUnitEntries).
  int32_t unit_entries = 0;
};

inline constexpr int32_t kWsUnits = -1;

// The persistent FP8 wgmma kernel's units for a sub-chunk of
// `total_entries` (sum of its groups' extents): that kernel runs one block
// per unit up to three per SM and gives each block an equal range of units,
// so small totals want few blocks of equal work. At most 3 x num_sms
// 64-entry tiles: one tile a unit (a block a tile); up to 16 x num_sms
// tiles: about two units per SM, in whole tiles; more: 256 entries (the
// blocks balance by range).
int32_t WsUnitEntries(int64_t total_entries, int32_t num_sms);

struct StepPlan {
  std::vector<LogitsGroup> groups;
  std::vector<LogitsUnit> units;
  std::vector<SubChunk> chunks;
};

// REQUIRES: `rows` validated (ValidateStepRows). RESOURCE_EXHAUSTED when a
// single row's logits do not fit the workspace.
absl::StatusOr<StepPlan> PlanStep(const StepRows& rows,
                                  const PlanLimits& limits);

// The candidate consumer's gather walk over step rows [row_begin, row_end):
// one group per row over its pool slots [0, min(n_r, pool_entries)) (the
// pool may hold fewer; the kernel bounds them on the device), cut into
// units of WsUnitEntries slots. Appends to *groups and *units; the units'
// group indices count from the start of *groups.
void PlanGather(const StepRows& rows, int32_t row_begin, int32_t row_end, int64_t pool_entries,
                int32_t num_sms, std::vector<LogitsGroup>* groups, std::vector<LogitsUnit>* units);

// wgmma_ws's claimed tail. The SMs do not run equally fast (ncu, H100, the
// block kernel at B=64 x 32k: active cycles 84.5k to 104k per SM with equal
// pages), so an even split ends with the slowest. The last `percent` % of a
// launch's units can therefore be left unsplit: a block's producer that ends
// its even share claims them from a counter, two units at a time
// (LogitsParams::claims). Measured on the H200 (s31): prefill 4k x 32k
// (groups of four rows) -41 us (1003 -> 1023 TFLOP/s) at 10 or 20 %, but
// decode of one row a group +1 to +17 us: a claim restarts the producer's
// walk, cheap beside a group of two or four rows' tiles (a team of two
// warpgroups multiplies each) and not beside one row's. Groups of two rows
// (next_n 2) at 20 %: logits B=64 x 32k -2.1 us (H200, s31), -1.3, B=128 x
// 32k -5.2 and B=128 x 128k -12.1 (H100, s32); at 10 % +2.1 (H200). But
// where each block has few units it costs: against no tail, same call
// (H100, s33), logits at 20 % B=64 x 8k next_n 2 (5 units a block) +8.0
// us, B=128 x 8k and B=8 x 128k next_n 2 (10 a block) +5.8 and +2.0, B=64 x
// 32k (21 a block) +0.1; B=128 x 32k (41) -4.1, B=64 / 128 x 128k (83 /
// 165) -7.4 / -12.1, prefill 4k x 32k -43. So the default claims 20 % where
// the launch has groups of two or more rows and the static share leaves
// every block `min_items_per_cta` = 24 units of its own (30 units a block
// before the tail), nothing where every group has one (knob
// INDEXER_GPU_WS_TAIL=N: N % on every launch that leaves 4 units a block,
// 0 none). (The same for the MiniMax block
// kernel, pages claimed one at a time by groups of warps, lost everywhere:
// h200_2026-12-06_s31.md.)
struct TailRule {
  int32_t percent = 0;  // 0..100
  int32_t min_items_per_cta = 4;
  int32_t min_group_rows = 1;  // launches whose largest group has fewer rows claim nothing
};
// The knob's rule where INDEXER_GPU_WS_TAIL is set (knobs.h), else 20 % for
// groups of two or more rows, 24 units a block kept.
TailRule DefaultWsTail();
// The units of a launch of `units` units over `grid` blocks, largest group
// `max_group_rows` rows, that `rule` leaves to be claimed (0: none).
int32_t WsTailUnits(const TailRule& rule, int64_t units, int64_t grid, int32_t max_group_rows);

// The block path's work map (params.h: BlockWorkMap) for pages of
// `page_entries`: starts[r] = sum over rows before r of their causal pages
// (num_rows + 1 values), and per sub-chunk [row_begin, row_end) of `chunks`
// the even split of its flat range [starts[row_begin], starts[row_end])
// over `ctas` CTAs as ctas + 1 pairs {first flat index, its row} (an empty
// CTA repeats its neighbour's pair; its row is always a row of the
// sub-chunk). cta_offsets[i] is where sub-chunk i's pairs begin in *cta.
// RESOURCE_EXHAUSTED when the flat range does not fit int32.
absl::Status PlanBlockWork(const StepRows& rows, int32_t page_entries,
                           const std::vector<SubChunk>& chunks, int32_t ctas,
                           std::vector<int32_t>* starts, std::vector<int32_t>* cta,
                           std::vector<int64_t>* cta_offsets);

}  // namespace gpu
}  // namespace indexer

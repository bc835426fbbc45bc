#include "kernels/gpu/plan.h"

#include <algorithm>

#include "absl/strings/str_cat.h"
#include "kernels/gpu/knobs.h"

namespace indexer {
namespace gpu {
namespace {

int64_t RoundUp(int64_t x, int64_t m) { return (x + m - 1) / m * m; }

// Entries per work unit: about four units per multiprocessor over the whole
// sub-chunk, in whole 64-entry tiles, between 256 and 2048 entries.
int32_t UnitEntries(int64_t total_entries, int32_t num_sms) {
  const int64_t target = total_entries / (4 * std::max(num_sms, 1));
  return static_cast<int32_t>(std::clamp<int64_t>(RoundUp(target, 64), 256, 2048));
}

}  // namespace

int32_t WsUnitEntries(int64_t total_entries, int32_t num_sms) {
  const int64_t sms = std::max(num_sms, 1);
  const int64_t tiles = (total_entries + 63) / 64;
  if (tiles <= 3 * sms) return 64;
  if (tiles <= 16 * sms) return static_cast<int32_t>(64 * ((tiles + 2 * sms - 1) / (2 * sms)));
  return 256;
}

absl::StatusOr<StepPlan> PlanStep(const StepRows& rows,
                                  const PlanLimits& limits) {
  StepPlan plan;
  const std::vector<std::pair<int32_t, int32_t>> chunks = rows.Chunks();

  // Sub-chunks: greedy over each server chunk under the workspace limits.
  for (const auto& [cb, ce] : chunks) {
    int32_t r = cb;
    while (r < ce) {
      SubChunk sc{r, r, 0, 0, 0, 0, 0};
      while (sc.row_end < ce) {
        const int32_t v = std::max(sc.max_visible, rows.row_visible[sc.row_end]);
        const int64_t stride = RoundUp(std::max(v, 1), 4);
        const int64_t n = sc.row_end - sc.row_begin + 1;
        if (n > 1 && (n > limits.max_rows || n * stride > limits.logits_floats)) break;
        if (n == 1 && stride > limits.logits_floats) {
          return absl::ResourceExhaustedError(absl::StrCat(
              "row_visible[", sc.row_end, "]: ", v,
              " entries exceed the gpu logits workspace of ",
              limits.logits_floats, " floats"));
        }
        sc.max_visible = v;
        sc.stride = stride;
        ++sc.row_end;
      }
      plan.chunks.push_back(sc);
      r = sc.row_end;
    }
  }

  // Row groups and units per sub-chunk.
  for (SubChunk& sc : plan.chunks) {
    const size_t g0 = plan.groups.size();
    int64_t total = 0;
    int32_t r = sc.row_begin;
    while (r < sc.row_end) {
      const int32_t s = rows.row_seq[r];
      const int32_t seq_end = std::min(rows.seq_row_begin[s + 1], sc.row_end);
      const int32_t n = std::min(kMaxGroupRows, seq_end - r);
      LogitsGroup g{s, r, n, 0};
      for (int32_t i = r; i < r + n; ++i) g.extent = std::max(g.extent, rows.row_visible[i]);
      total += g.extent;
      sc.max_group_rows = std::max(sc.max_group_rows, n);
      plan.groups.push_back(g);
      r += n;
    }
    const int32_t unit = limits.unit_entries > 0           ? limits.unit_entries
                         : limits.unit_entries == kWsUnits ? WsUnitEntries(total, limits.num_sms)
                                                           : UnitEntries(total, limits.num_sms);
    sc.unit_begin = static_cast<int32_t>(plan.units.size());
    // Reserved at once: a B=64 x 32k step has about 8,000 units, and growing
    // the vector by doubling cost ~200 us of copies and fresh-page faults in
    // every step header.
    int64_t count = 0;
    for (size_t gi = g0; gi < plan.groups.size(); ++gi) {
      count += (plan.groups[gi].extent + unit - 1) / unit;
    }
    plan.units.reserve(plan.units.size() + static_cast<size_t>(count));
    for (size_t gi = g0; gi < plan.groups.size(); ++gi) {
      const LogitsGroup& g = plan.groups[gi];
      for (int32_t e = 0; e < g.extent; e += unit) {
        plan.units.push_back({static_cast<int32_t>(gi), e, std::min(e + unit, g.extent), g.seq, g.row_begin,
                              g.num_rows, -1});
      }
    }
    sc.unit_end = static_cast<int32_t>(plan.units.size());
  }
  return plan;
}

void PlanGather(const StepRows& rows, int32_t row_begin, int32_t row_end, int64_t pool_entries,
                int32_t num_sms, std::vector<LogitsGroup>* groups, std::vector<LogitsUnit>* units) {
  int64_t total = 0;
  for (int32_t r = row_begin; r < row_end; ++r) total += std::min<int64_t>(rows.row_visible[r], pool_entries);
  const int32_t unit = WsUnitEntries(total, num_sms);
  for (int32_t r = row_begin; r < row_end; ++r) {
    const int32_t extent = static_cast<int32_t>(std::min<int64_t>(rows.row_visible[r], pool_entries));
    const int32_t gi = static_cast<int32_t>(groups->size());
    groups->push_back({rows.row_seq[r], r, 1, extent});
    for (int32_t e = 0; e < extent; e += unit) {
      units->push_back({gi, e, std::min(e + unit, extent), rows.row_seq[r], r, 1, -1});
    }
  }
}

TailRule DefaultWsTail() {
  TailRule rule;
  if (Knobs().ws_tail_percent >= 0) {
    rule.percent = Knobs().ws_tail_percent;
  } else {
    rule.percent = 20;
    rule.min_group_rows = 2;
    rule.min_items_per_cta = 24;
  }
  return rule;
}

int32_t WsTailUnits(const TailRule& rule, int64_t units, int64_t grid, int32_t max_group_rows) {
  if (rule.percent <= 0 || max_group_rows < rule.min_group_rows) return 0;
  const int64_t tail = units * std::min(rule.percent, 100) / 100;
  if (tail <= 0 || units - tail < grid * rule.min_items_per_cta) return 0;
  return static_cast<int32_t>(tail);
}

absl::Status PlanBlockWork(const StepRows& rows, int32_t page_entries,
                           const std::vector<SubChunk>& chunks, int32_t ctas,
                           std::vector<int32_t>* starts, std::vector<int32_t>* cta,
                           std::vector<int64_t>* cta_offsets) {
  const int32_t nr = rows.num_rows;
  starts->assign(static_cast<size_t>(nr) + 1, 0);
  int64_t total = 0;
  for (int32_t r = 0; r < nr; ++r) {
    total += (static_cast<int64_t>(rows.row_visible[r]) + page_entries - 1) / page_entries;
    if (total > INT32_MAX) {
      return absl::ResourceExhaustedError(absl::StrCat(
          "block path: the step's causal pages exceed ", INT32_MAX, " (row ", r, ")"));
    }
    (*starts)[r + 1] = static_cast<int32_t>(total);
  }
  cta->clear();
  cta_offsets->clear();
  for (const SubChunk& sc : chunks) {
    cta_offsets->push_back(static_cast<int64_t>(cta->size()));
    const int64_t lo = (*starts)[sc.row_begin], span = (*starts)[sc.row_end] - lo;
    int32_t r = sc.row_begin;
    for (int32_t c = 0; c <= ctas; ++c) {
      const int64_t f = lo + span * c / ctas;
      // The row holding f (starts[r] <= f < starts[r + 1]); the range's end
      // stays on the sub-chunk's last row.
      while (r + 1 < sc.row_end && (*starts)[r + 1] <= f) ++r;
      cta->push_back(static_cast<int32_t>(f));
      cta->push_back(r);
    }
  }
  return absl::OkStatus();
}

}  // namespace gpu
}  // namespace indexer

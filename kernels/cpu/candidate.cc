// The two-level candidate path of the cpu backend (SPEC §5): the source
// (dense walk + block maxima -> per-row pools in the step context) and the
// consumers (gathered or masked, same output).
#include <algorithm>
#include <cmath>
#include <cstdint>
#include <limits>
#include <memory>
#include <vector>

#include "absl/strings/str_cat.h"
#include "kernels/common/status_macros.h"
#include "kernels/cpu/cpu_backend.h"
#include "kernels/cpu/cpu_internal.h"
#include "kernels/cpu/dense_logits.h"
#include "kernels/cpu/topk.h"
#include "oneapi/tbb/blocked_range.h"
#include "oneapi/tbb/parallel_for.h"

namespace indexer {
namespace {

using cpu_internal::Bad;
using cpu_internal::CandidatePool;
using cpu_internal::Clock;
using cpu_internal::CpuStepContext;
using cpu_internal::MicrosSince;

int32_t CeilDiv(int32_t a, int32_t b) { return (a + b - 1) / b; }

absl::Status CheckSpec(const CandidateSpec& spec) {
  if (spec.set < 0) return Bad("candidate set", ">= 0", spec.set);
  if (spec.block_size < 1) {
    return Bad("candidate_block_size", ">= 1", spec.block_size);
  }
  if (spec.topk_blocks < 1) {
    return Bad("candidate_topk_blocks", ">= 1", spec.topk_blocks);
  }
  if (spec.gate_ratio < 0) return Bad("gate_ratio", ">= 0", spec.gate_ratio);
  return absl::OkStatus();
}

// The step's context as ours, or INVALID_ARGUMENT: the pools live in it.
absl::StatusOr<CpuStepContext*> OwnContext(StepContext* ctx) {
  auto* cpu_ctx = dynamic_cast<CpuStepContext*>(ctx);
  if (cpu_ctx == nullptr) {
    return absl::InvalidArgumentError(
        "ctx: expected the step's context from PrepareStep (candidate pools "
        "live in it)");
  }
  return cpu_ctx;
}

// Row sizes of the pools: min(causal blocks, topk_blocks) per row.
std::shared_ptr<CandidatePool> NewPool(const StepRows& rows,
                                       const CandidateSpec& spec) {
  auto pool = std::make_shared<CandidatePool>();
  pool->block_size = spec.block_size;
  pool->topk_blocks = spec.topk_blocks;
  pool->row_begin.assign(static_cast<size_t>(rows.num_rows) + 1, 0);
  pool->entries.assign(static_cast<size_t>(rows.num_rows), 0);
  pool->row_visible = rows.row_visible;
  for (int32_t r = 0; r < rows.num_rows; ++r) {
    const int32_t blocks = CeilDiv(rows.row_visible[r], spec.block_size);
    pool->row_begin[r + 1] =
        pool->row_begin[r] + std::min(blocks, spec.topk_blocks);
  }
  pool->blocks.assign(static_cast<size_t>(pool->row_begin.back()), -1);
  return pool;
}

// Writes row r's pool (ascending block ids) from its logits [n] and returns
// the entries it holds below n.
int32_t SelectPool(const float* logits, int32_t n, const CandidateSpec& spec,
                   int32_t* blocks) {
  const int32_t bs = spec.block_size, nb = CeilDiv(n, bs);
  if (nb <= spec.topk_blocks) {
    for (int32_t b = 0; b < nb; ++b) blocks[b] = b;
    return n;
  }
  thread_local std::vector<float> maxima;
  maxima.resize(static_cast<size_t>(nb));
  for (int32_t b = 0; b < nb; ++b) {
    const float* x = logits + static_cast<int64_t>(b) * bs;
    const int32_t count = std::min(bs, n - b * bs);
    float m = x[0];
    for (int32_t i = 1; i < count; ++i) m = std::max(m, x[i]);
    maxima[b] = m;
  }
  // TopkRow's order: largest maximum first, ties -> smaller block id, so the
  // weakest chosen block is the last one.
  const int32_t k = spec.topk_blocks;
  TopkRow(maxima.data(), nb, k, blocks);
  if (spec.pin_newest && std::find(blocks, blocks + k, nb - 1) == blocks + k) {
    blocks[k - 1] = nb - 1;
  }
  std::sort(blocks, blocks + k);
  return PoolEntries(n, bs, k, blocks[k - 1] == nb - 1);
}

// A row whose pool holds no more than topk entries: all of them, ascending,
// then -1. Gathered and masked consumers both answer such rows this way
// without scoring them.
void WholePool(const CandidatePool& cands, int32_t r, int32_t topk,
               int32_t* out) {
  const int32_t c = cands.entries[r];
  const int32_t* blocks = cands.row_blocks(r);
  for (int32_t j = 0; j < c; ++j)
    out[j] = PoolSlotEntry(blocks, cands.block_size, j);
  std::fill(out + c, out + topk, -1);
}

// Top-k over pool slots: slot values [c] (slot order is position order, so
// TopkRow's tie rule is the positions'), remapped to entry positions.
void TopkSlots(const CandidatePool& cands, int32_t r, const float* slots,
               int32_t topk, int32_t* out) {
  TopkRow(slots, cands.entries[r], topk, out);
  const int32_t* blocks = cands.row_blocks(r);
  for (int32_t i = 0; i < topk; ++i) {
    if (out[i] >= 0) out[i] = PoolSlotEntry(blocks, cands.block_size, out[i]);
  }
}

// Masked form of one row: logits [n] of the dense walk; -inf outside the
// pool, then TopkRow over the whole row.
void MaskedRow(const CandidatePool& cands, int32_t r, float* logits, int32_t n,
               int32_t topk, int32_t* out) {
  const int32_t bs = cands.block_size, count = cands.count(r);
  const int32_t* blocks = cands.row_blocks(r);
  constexpr float kMasked = -std::numeric_limits<float>::infinity();
  int32_t next = 0;  // first entry not yet masked or kept
  for (int32_t i = 0; i < count; ++i) {
    std::fill(logits + next, logits + static_cast<int64_t>(blocks[i]) * bs,
              kMasked);
    next = std::min(n, (blocks[i] + 1) * bs);
  }
  std::fill(logits + next, logits + n, kMasked);
  TopkRow(logits, n, topk, out);
  // The pool holds more than topk entries, so only a pool logit that is
  // itself -inf (or a negative NaN) can lose to a masked entry. Then select
  // among the pool's values alone, as the gathered form does.
  bool outside = false;
  for (int32_t i = 0; i < topk && !outside; ++i) {
    const int32_t b = out[i] / bs;
    outside = !std::binary_search(blocks, blocks + count, b);
  }
  if (!outside) return;
  thread_local std::vector<float> slots;
  slots.resize(static_cast<size_t>(cands.entries[r]));
  for (int32_t j = 0; j < cands.entries[r]; ++j) {
    slots[j] = logits[PoolSlotEntry(blocks, bs, j)];
  }
  TopkSlots(cands, r, slots.data(), topk, out);
}

}  // namespace

absl::StatusOr<LayerTimings> CpuBackend::CandidateSource(
    const PageLayout& layout, PoolHandle pool_h, const StepRows& rows,
    StepContext* ctx, const QInput& q, int32_t topk, const CandidateSpec& spec,
    int32_t* out) {
  ASSIGN_OR_RETURN(const Pool p, FindPool(pool_h, layout));
  uint8_t* const pool = p.data;
  ASSIGN_OR_RETURN(CpuStepContext * cpu_ctx, OwnContext(ctx));
  RETURN_IF_ERROR(cpu_internal::ValidateOnce(layout, rows, ctx, p.num_pages));
  RETURN_IF_ERROR(CheckSpec(spec));
  if (topk < 0) return Bad("topk", ">= 0", topk);
  std::shared_ptr<CandidatePool> cands = NewPool(rows, spec);
  LayerTimings timings;
  if (rows.num_rows > 0) {
    RETURN_IF_ERROR(cpu_internal::CheckQ(layout, q));
    if (topk > 0 && out == nullptr) {
      return absl::InvalidArgumentError("out: expected a buffer, got null");
    }
    CandidatePool& c = *cands;
    timings = DenseWalk(layout, pool, rows, q, [&](int32_t r, float* logits) {
      const int32_t n = rows.row_visible[r];
      if (topk > 0)
        TopkRow(logits, n, topk, out + static_cast<int64_t>(r) * topk);
      c.entries[r] =
          SelectPool(logits, n, spec, c.blocks.data() + c.row_begin[r]);
    });
  }
  cpu_ctx->PutPool(spec.set, std::move(cands));
  return timings;
}

absl::StatusOr<LayerTimings> CpuBackend::CandidateConsumer(
    const PageLayout& layout, PoolHandle pool_h, const StepRows& rows,
    StepContext* ctx, const QInput& q, int32_t topk, const CandidateSpec& spec,
    ConsumerMode mode, int32_t* out) {
  ASSIGN_OR_RETURN(const Pool p, FindPool(pool_h, layout));
  uint8_t* const pool = p.data;
  ASSIGN_OR_RETURN(CpuStepContext * cpu_ctx, OwnContext(ctx));
  RETURN_IF_ERROR(cpu_internal::ValidateOnce(layout, rows, ctx, p.num_pages));
  RETURN_IF_ERROR(CheckSpec(spec));
  if (topk < 0) return Bad("topk", ">= 0", topk);
  const std::shared_ptr<const CandidatePool> cands = cpu_ctx->GetPool(spec.set);
  if (cands == nullptr) {
    return absl::FailedPreconditionError(
        absl::StrCat("candidate set ", spec.set,
                     ": the source layer has not run in this step"));
  }
  if (cands->block_size != spec.block_size ||
      cands->topk_blocks != spec.topk_blocks) {
    return absl::InvalidArgumentError(absl::StrCat(
        "candidate set ", spec.set, ": expected the source's block_size ",
        cands->block_size, " and topk_blocks ", cands->topk_blocks, ", got ",
        spec.block_size, " and ", spec.topk_blocks));
  }
  // Pools are per row: the consumer's rows must be the ones the source saw
  // (the same step's, by content; the StepRows object may have moved).
  if (cands->row_visible != rows.row_visible) {
    return absl::InvalidArgumentError(absl::StrCat(
        "rows: expected the rows candidate set ", spec.set,
        "'s source ran on (", cands->num_rows(),
        " rows with the same visible entries), got ", rows.num_rows, " rows"));
  }
  if (rows.num_rows == 0 || topk == 0) return LayerTimings{};
  RETURN_IF_ERROR(cpu_internal::CheckQ(layout, q));
  if (out == nullptr) {
    return absl::InvalidArgumentError("out: expected a buffer, got null");
  }

  if (mode == ConsumerMode::kAuto) {
    // The length gate of SPEC §5: gathering pays once the widest row sees
    // well more than a pool. rows.max_visible is recomputed, not trusted.
    int64_t widest = 0;
    for (int32_t n : rows.row_visible) widest = std::max<int64_t>(widest, n);
    const int64_t pool_entries =
        static_cast<int64_t>(spec.topk_blocks) * spec.block_size;
    mode = widest > spec.gate_ratio * pool_entries ? ConsumerMode::kGather
                                                   : ConsumerMode::kMasked;
  }
  if (mode == ConsumerMode::kGather) {
    return GatherConsumer(layout, pool, rows, q, *cands, topk, out);
  }
  const CandidatePool& c = *cands;
  return DenseWalk(layout, pool, rows, q, [&](int32_t r, float* logits) {
    int32_t* row_out = out + static_cast<int64_t>(r) * topk;
    if (c.entries[r] <= topk) {
      WholePool(c, r, topk, row_out);
    } else {
      MaskedRow(c, r, logits, rows.row_visible[r], topk, row_out);
    }
  });
}

LayerTimings CpuBackend::GatherConsumer(const PageLayout& layout,
                                        const uint8_t* pool,
                                        const StepRows& rows, const QInput& q,
                                        const CandidatePool& cands,
                                        int32_t topk, int32_t* out) const {
  LayerTimings timings;
  std::vector<int64_t> offsets;
  std::vector<float> slots;
  for (const auto& [rb, re] : rows.Chunks()) {
    // Compact logits of the chunk's rows, one slot per pool entry; rows whose
    // whole pool fits in topk need none.
    offsets.assign(static_cast<size_t>(re - rb) + 1, 0);
    for (int32_t r = rb; r < re; ++r) {
      const int32_t c = cands.entries[r];
      offsets[r - rb + 1] = offsets[r - rb] + (c > topk ? c : 0);
    }
    slots.resize(static_cast<size_t>(offsets.back()));
    const std::vector<cpu_internal::GatherTask> tasks =
        cpu_internal::PlanGatherTasks(offsets, rb);
    const cpu_internal::GatherParams params{
        &layout, pool, &rows, &q, &cands, rb, offsets.data(), slots.data()};

    Clock::time_point t0 = Clock::now();
    arena_.execute([&] {
      tbb::parallel_for(tbb::blocked_range<size_t>(0, tasks.size(), 1),
                        [&](const tbb::blocked_range<size_t>& range) {
                          for (size_t t = range.begin(); t < range.end(); ++t) {
                            cpu_internal::RunGatherTask(params, tasks[t]);
                          }
                        });
    });
    timings.logits_us += MicrosSince(t0);

    t0 = Clock::now();
    arena_.execute([&] {
      tbb::parallel_for(
          tbb::blocked_range<int32_t>(rb, re, 1),
          [&](const tbb::blocked_range<int32_t>& range) {
            for (int32_t r = range.begin(); r < range.end(); ++r) {
              int32_t* row_out = out + static_cast<int64_t>(r) * topk;
              if (cands.entries[r] <= topk) {
                WholePool(cands, r, topk, row_out);
              } else {
                TopkSlots(cands, r, slots.data() + offsets[r - rb], topk,
                          row_out);
              }
            }
          });
    });
    timings.topk_us += MicrosSince(t0);
  }
  return timings;
}

}  // namespace indexer

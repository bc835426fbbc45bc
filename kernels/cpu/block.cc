// The MiniMax-M3 block path of the cpu backend (SPEC §5 "Block path"):
// per-head block scores over MXFP4 pages (block = page), init / local
// sentinels, top-k block ids.
#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <limits>
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
using cpu_internal::Clock;
using cpu_internal::kEntryBlock;
using cpu_internal::MicrosSince;

// Sentinels of the forced blocks, as the model's scorer writes them.
constexpr float kInitSentinel = 1e30f;
constexpr float kLocalSentinel = 1e29f;
// Rows of one sequence per task (they share each decoded K block) and
// entries per task (whole blocks, at least one).
constexpr int32_t kTaskRows = 8;
constexpr int32_t kTaskEntries = 512;
static_assert(kEntryBlock % 8 == 0,
              "the entry block is a whole number of vectors");

#if defined(__x86_64__) && defined(__GNUC__) && !defined(__clang__)
#define INDEXER_CPU_CLONES \
  __attribute__((target_clones("arch=x86-64-v3", "default")))
#else
#define INDEXER_CPU_CLONES
#endif

typedef float V8 __attribute__((vector_size(32)));
constexpr int kVecs = kEntryBlock / 8;

// out[h, j] = scale * (q[h, :] . kt[:, j]) for j < kEntryBlock, fp32.
// q: [H, D], kt: [D, kEntryBlock], out: [H, kEntryBlock].
INDEXER_CPU_CLONES
void BlockDots(const float* q, int32_t heads, int32_t dim, const float* kt,
               float scale, float* out) {
  for (int32_t h = 0; h < heads; ++h) {
    V8 acc[kVecs] = {};
    const float* qh = q + static_cast<int64_t>(h) * dim;
    for (int32_t d = 0; d < dim; ++d) {
      const float* k = kt + static_cast<int64_t>(d) * kEntryBlock;
      for (int v = 0; v < kVecs; ++v) {
        V8 kv;
        std::memcpy(&kv, k + 8 * v, sizeof kv);
        acc[v] += qh[d] * kv;
      }
    }
    for (int v = 0; v < kVecs; ++v) acc[v] *= scale;
    std::memcpy(out + static_cast<int64_t>(h) * kEntryBlock, acc, sizeof acc);
  }
}

int32_t CeilDiv(int32_t a, int32_t b) { return (a + b - 1) / b; }

// Rows [row_begin, row_end) of sequence `seq` over blocks
// [block_begin, block_end).
struct BlockTask {
  int32_t seq;
  int32_t row_begin;
  int32_t row_end;
  int32_t block_begin;
  int32_t block_end;
};

std::vector<BlockTask> PlanBlockTasks(const StepRows& rows, int32_t rb,
                                      int32_t re, int32_t page_entries) {
  const int32_t per_task = std::max(1, kTaskEntries / page_entries);
  std::vector<BlockTask> tasks;
  for (int32_t r = rb; r < re;) {
    const int32_t seq = rows.row_seq[r];
    const int32_t seq_end =
        std::min(re, rows.seq_row_begin[static_cast<size_t>(seq) + 1]);
    for (int32_t r0 = r; r0 < seq_end; r0 += kTaskRows) {
      const int32_t r1 = std::min(seq_end, r0 + kTaskRows);
      int32_t visible = 0;
      for (int32_t i = r0; i < r1; ++i) {
        visible = std::max(visible, rows.row_visible[i]);
      }
      const int32_t blocks = CeilDiv(visible, page_entries);
      for (int32_t b = 0; b < blocks; b += per_task) {
        tasks.push_back({seq, r0, r1, b, std::min(blocks, b + per_task)});
      }
    }
    r = seq_end;
  }
  return tasks;
}

struct BlockParams {
  const PageLayout* layout;
  const uint8_t* pool;
  const StepRows* rows;
  const BlockQInput* q;  // [num_rows, Hi, D] fp32
  float scale;
  int32_t chunk_row_begin;
  int32_t chunk_rows;
  int32_t width;  // blocks per score row
  float* scores;  // [Hi, chunk_rows, width] fp32
};

// score[h, r, b] for the task's rows and blocks, b causal for r.
void RunBlockTask(const BlockParams& p, const BlockTask& task) {
  struct Scratch {
    std::vector<float> kt, block_scale, dots, best;
    float kscale[kEntryBlock];
  };
  thread_local Scratch s;
  const PageLayout& layout = *p.layout;
  const StepRows& rows = *p.rows;
  const int32_t dim = layout.head_dim, heads = p.q->num_heads;
  const int32_t per_page = layout.page_entries;
  const int32_t nrows = task.row_end - task.row_begin;
  s.kt.resize(static_cast<size_t>(dim) * kEntryBlock);
  s.block_scale.resize(static_cast<size_t>(dim) / kMxBlock);
  s.dots.resize(static_cast<size_t>(heads) * kEntryBlock);
  s.best.resize(static_cast<size_t>(nrows) * heads);

  int32_t visible = 0;
  for (int32_t r = task.row_begin; r < task.row_end; ++r) {
    visible = std::max(visible, rows.row_visible[r]);
  }
  for (int32_t b = task.block_begin; b < task.block_end; ++b) {
    std::fill(s.best.begin(), s.best.end(),
              -std::numeric_limits<float>::infinity());
    const int32_t e_end = std::min(visible, (b + 1) * per_page);
    for (int32_t e0 = b * per_page; e0 < e_end; e0 += kEntryBlock) {
      const int32_t n = std::min(kEntryBlock, e_end - e0);
      cpu_internal::DecodeKRun(layout, p.pool, rows, task.seq, e0, n,
                               s.kt.data(), s.kscale, s.block_scale.data());
      for (int32_t i = 0; i < nrows; ++i) {
        const int32_t r = task.row_begin + i;
        const int32_t count = std::min(n, rows.row_visible[r] - e0);
        if (count <= 0) continue;
        BlockDots(p.q->q + static_cast<int64_t>(r) * heads * dim, heads, dim,
                  s.kt.data(), p.scale, s.dots.data());
        for (int32_t h = 0; h < heads; ++h) {
          const float* d =
              s.dots.data() + static_cast<int64_t>(h) * kEntryBlock;
          float& best = s.best[static_cast<size_t>(i) * heads + h];
          for (int32_t j = 0; j < count; ++j) best = std::max(best, d[j]);
        }
      }
    }
    for (int32_t i = 0; i < nrows; ++i) {
      const int32_t r = task.row_begin + i;
      if (static_cast<int64_t>(b) * per_page >= rows.row_visible[r]) continue;
      for (int32_t h = 0; h < heads; ++h) {
        p.scores[(static_cast<int64_t>(h) * p.chunk_rows +
                  (r - p.chunk_row_begin)) *
                     p.width +
                 b] = s.best[static_cast<size_t>(i) * heads + h];
      }
    }
  }
}

// Forces the init and local blocks of a row of `causal` block scores.
void PinForcedBlocks(float* score, int32_t causal, const BlockSpec& spec) {
  const int32_t local_begin = std::max(0, causal - spec.local_blocks);
  for (int32_t b = local_begin; b < causal; ++b) score[b] = kLocalSentinel;
  // Init wins where both apply.
  for (int32_t b = 0; b < std::min(causal, spec.init_blocks); ++b) {
    score[b] = kInitSentinel;
  }
}

}  // namespace

absl::StatusOr<LayerTimings> CpuBackend::BlockTopk(
    const PageLayout& layout, PoolHandle pool_h, const StepRows& rows,
    StepContext* ctx, const BlockQInput& q, const BlockSpec& spec,
    int32_t* out) {
  ASSIGN_OR_RETURN(const Pool p, FindPool(pool_h, layout));
  uint8_t* const pool = p.data;
  if (layout.format != KvFormat::kMxfp4) {
    return absl::InvalidArgumentError(
        absl::StrCat("layout: the block path expected MXFP4 K pages, got ",
                     KvFormatName(layout.format)));
  }
  RETURN_IF_ERROR(cpu_internal::ValidateOnce(layout, rows, ctx, p.num_pages));
  if (spec.topk_blocks < 0) return Bad("topk_blocks", ">= 0", spec.topk_blocks);
  if (spec.init_blocks < 0) return Bad("init_blocks", ">= 0", spec.init_blocks);
  if (spec.local_blocks < 0) {
    return Bad("local_blocks", ">= 0", spec.local_blocks);
  }
  if (!std::isfinite(spec.scale) || spec.scale <= 0) {
    return absl::InvalidArgumentError(absl::StrCat(
        "scale: expected a finite value > 0 (D^-0.5), got ", spec.scale));
  }
  if (q.num_heads < 1) return Bad("q.num_heads", ">= 1", q.num_heads);
  LayerTimings timings;
  if (rows.num_rows == 0 || spec.topk_blocks == 0) return timings;
  if (q.q == nullptr) {
    return absl::InvalidArgumentError(
        "q: expected a [rows, Hi, D] tensor, got null");
  }
  if (out == nullptr) {
    return absl::InvalidArgumentError("out: expected a buffer, got null");
  }

  const int32_t heads = q.num_heads, per_page = layout.page_entries;
  const int32_t k = spec.topk_blocks;
  std::vector<float> scores;
  for (const auto& [rb, re] : rows.Chunks()) {
    int32_t width = 0;
    for (int32_t r = rb; r < re; ++r) {
      width = std::max(width, CeilDiv(rows.row_visible[r], per_page));
    }
    scores.resize(static_cast<size_t>(heads) * (re - rb) * width);
    const std::vector<BlockTask> tasks = PlanBlockTasks(rows, rb, re, per_page);
    const BlockParams params{&layout, pool,    &rows, &q,           spec.scale,
                             rb,      re - rb, width, scores.data()};

    Clock::time_point t0 = Clock::now();
    arena_.execute([&] {
      tbb::parallel_for(tbb::blocked_range<size_t>(0, tasks.size(), 1),
                        [&](const tbb::blocked_range<size_t>& range) {
                          for (size_t t = range.begin(); t < range.end(); ++t) {
                            RunBlockTask(params, tasks[t]);
                          }
                        });
    });
    timings.logits_us += MicrosSince(t0);

    // One (head, row) pair per index, head-major like `out`.
    t0 = Clock::now();
    const int64_t pairs = static_cast<int64_t>(heads) * (re - rb);
    arena_.execute([&] {
      tbb::parallel_for(
          tbb::blocked_range<int64_t>(0, pairs, 1),
          [&](const tbb::blocked_range<int64_t>& range) {
            for (int64_t i = range.begin(); i < range.end(); ++i) {
              const int32_t h = static_cast<int32_t>(i / (re - rb));
              const int32_t r = rb + static_cast<int32_t>(i % (re - rb));
              const int32_t causal = CeilDiv(rows.row_visible[r], per_page);
              float* score = scores.data() + i * width;
              PinForcedBlocks(score, causal, spec);
              TopkRow(score, causal, k,
                      out + (static_cast<int64_t>(h) * rows.num_rows + r) * k);
            }
          });
    });
    timings.topk_us += MicrosSince(t0);
  }
  return timings;
}

}  // namespace indexer

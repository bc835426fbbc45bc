#include "kernels/cpu/cpu_backend.h"

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstdlib>
#include <cstring>
#include <vector>

#include "absl/strings/str_cat.h"
#include "kernels/common/status_macros.h"
#include "kernels/cpu/cpu_internal.h"
#include "kernels/cpu/dense_logits.h"
#include "kernels/cpu/topk.h"
#include "kernels/format/fp8.h"
#include "kernels/format/mxfp4.h"
#include "kernels/format/numeric.h"
#include "oneapi/tbb/blocked_range.h"
#include "oneapi/tbb/parallel_for.h"

namespace indexer {
namespace {

using cpu_internal::Bad;
using cpu_internal::Clock;
using cpu_internal::MicrosSince;

}  // namespace

namespace cpu_internal {

double MicrosSince(Clock::time_point t0) {
  return std::chrono::duration<double, std::micro>(Clock::now() - t0).count();
}

absl::Status Bad(absl::string_view field, absl::string_view expected,
                 int64_t got) {
  return absl::InvalidArgumentError(
      absl::StrCat(field, ": expected ", expected, ", got ", got));
}

absl::Status CheckQ(const PageLayout& layout, const QInput& q) {
  if (q.on_device) {
    return absl::FailedPreconditionError("q: device tensors need the gpu backend");
  }
  if (q.num_heads < 1) return Bad("q.num_heads", ">= 1", q.num_heads);
  if (q.values == nullptr || q.weights == nullptr ||
      (layout.format == KvFormat::kMxfp4 && q.scales == nullptr)) {
    return absl::InvalidArgumentError(absl::StrCat(
        "q: expected values, weights",
        layout.format == KvFormat::kMxfp4 ? " and scales" : "",
        " tensors, got null"));
  }
  return absl::OkStatus();
}

bool CpuStepContext::Checked(const StepRows& rows, int64_t num_pages) const {
  return Owns(rows) && checked_pages_.load() == num_pages;
}

void CpuStepContext::MarkChecked(const StepRows& rows, int64_t num_pages) {
  if (Owns(rows)) checked_pages_.store(num_pages);
}

void CpuStepContext::PutPool(int32_t set,
                             std::shared_ptr<const CandidatePool> pool) {
  absl::MutexLock lock(&mu_);
  pools_[set] = std::move(pool);
}

std::shared_ptr<const CandidatePool> CpuStepContext::GetPool(
    int32_t set) const {
  absl::MutexLock lock(&mu_);
  auto it = pools_.find(set);
  return it == pools_.end() ? nullptr : it->second;
}

absl::Status ValidateOnce(const PageLayout& layout, const StepRows& rows,
                          StepContext* ctx, int64_t num_pages) {
  auto* cpu_ctx = dynamic_cast<CpuStepContext*>(ctx);
  if (cpu_ctx != nullptr && cpu_ctx->Checked(rows, num_pages)) {
    return absl::OkStatus();
  }
  RETURN_IF_ERROR(ValidateStepRows(layout, rows, num_pages));
  if (cpu_ctx != nullptr) cpu_ctx->MarkChecked(rows, num_pages);
  return absl::OkStatus();
}

}  // namespace cpu_internal

CpuBackend::CpuBackend(int threads)
    : threads_(threads > 0 ? threads
                           : tbb::this_task_arena::max_concurrency()),
      arena_(threads_) {}

CpuBackend::~CpuBackend() {
  absl::MutexLock lock(&mu_);
  for (Pool& p : pools_) std::free(p.data);
}

std::string CpuBackend::Describe() const {
  return absl::StrCat("cpu (", threads_, " threads)");
}

absl::StatusOr<PoolHandle> CpuBackend::AllocatePool(const PageLayout& layout,
                                                  int64_t num_pages) {
  const int64_t page_bytes = layout.page_bytes();
  if (num_pages < 1) return Bad("num_pages", ">= 1", num_pages);
  if (page_bytes < 1 || num_pages > (int64_t{1} << 62) / page_bytes) {
    return Bad("num_pages", "a pool size that fits in 2^62 bytes", num_pages);
  }
  void* data = std::calloc(static_cast<size_t>(num_pages),
                           static_cast<size_t>(page_bytes));
  if (data == nullptr) {
    return absl::ResourceExhaustedError(
        absl::StrCat("pool: cannot allocate ", num_pages, " pages of ",
                     page_bytes, " bytes (", layout.DebugString(), ")"));
  }
  absl::MutexLock lock(&mu_);
  pools_.push_back({static_cast<uint8_t*>(data), num_pages, page_bytes});
  return PoolHandle{this, static_cast<int32_t>(pools_.size() - 1), static_cast<uint8_t*>(data),
                    num_pages, layout};
}

absl::StatusOr<CpuBackend::Pool> CpuBackend::FindPool(
    PoolHandle handle, const PageLayout& layout) const {
  absl::MutexLock lock(&mu_);
  // O(1): the handle names the pool; no search and no re-proof.
  if (handle.owner != this || handle.index < 0 ||
      handle.index >= static_cast<int32_t>(pools_.size()) ||
      pools_[handle.index].data != handle.base) {
    return absl::InvalidArgumentError("pool: expected a pool handle from this backend");
  }
  const Pool& p = pools_[handle.index];
  if (p.page_bytes != layout.page_bytes()) {
    return Bad("pool page bytes", absl::StrCat(layout.page_bytes(), " (",
                                               layout.DebugString(), ")"),
               p.page_bytes);
  }
  return p;
}

absl::StatusOr<std::unique_ptr<StepContext>> CpuBackend::PrepareStep(
    const PageLayout& layout, StepRows rows) {
  // Pages are checked against the pool by the first call; the shape here.
  RETURN_IF_ERROR(ValidateStepRows(layout, rows, INT64_MAX));
  return std::make_unique<cpu_internal::CpuStepContext>(std::move(rows));
}

absl::StatusOr<double> CpuBackend::WriteEntries(const PageLayout& layout,
                                                PoolHandle pool_h,
                                                const StepRows& rows,
                                                StepContext* ctx,
                                                const KInput& k) {
  const Clock::time_point t0 = Clock::now();
  ASSIGN_OR_RETURN(const Pool p, FindPool(pool_h, layout));
  uint8_t* const pool = p.data;
  RETURN_IF_ERROR(cpu_internal::ValidateOnce(layout, rows, ctx, p.num_pages));
  const int64_t n = rows.NewEntries();
  if (n == 0) return MicrosSince(t0);
  if (k.on_device) {
    return absl::FailedPreconditionError("k: device tensors need the gpu backend");
  }
  if (k.data == nullptr) {
    return absl::InvalidArgumentError("k.data: expected a tensor, got null");
  }
  const int32_t dim = layout.head_dim, vb = layout.value_bytes();
  const int32_t eb = layout.entry_bytes(), per_page = layout.page_entries;
  const bool fp8 = layout.format == KvFormat::kFp8;

  auto write_range = [&](const tbb::blocked_range<int64_t>& range) {
    std::vector<uint8_t> entry(static_cast<size_t>(eb));
    std::vector<float> x(k.kind == KInput::Kind::kBf16 ? dim : 0);
    int32_t s = static_cast<int32_t>(
        std::upper_bound(rows.seq_k_begin.begin(), rows.seq_k_begin.end(),
                         range.begin()) -
        rows.seq_k_begin.begin() - 1);
    for (int64_t i = range.begin(); i < range.end(); ++i) {
      while (i >= rows.seq_k_begin[s + 1]) ++s;
      const int32_t pos =
          rows.seq_old_entries[s] +
          static_cast<int32_t>(i - rows.seq_k_begin[s]);
      uint8_t* page = pool + layout.PageOffset(rows.Page(s, pos / per_page));
      const uint8_t* linear = entry.data();
      if (k.kind == KInput::Kind::kQuantized) {
        linear = static_cast<const uint8_t*>(k.data) + i * eb;
      } else {
        const float* src;
        if (k.kind == KInput::Kind::kFloat32) {
          src = static_cast<const float*>(k.data) + i * dim;
        } else {
          const uint16_t* h = static_cast<const uint16_t*>(k.data) + i * dim;
          for (int32_t d = 0; d < dim; ++d) x[d] = Bf16ToFloat(h[d]);
          src = x.data();
        }
        if (fp8) {
          const float scale =
              QuantizeFp8Entry(src, dim, k.ue8m0, entry.data(), layout.fp8);
          std::memcpy(entry.data() + vb, &scale, sizeof scale);
        } else {
          QuantizeMxfp4(src, dim, entry.data(), entry.data() + vb);
        }
      }
      StoreEntry(layout, linear, pos % per_page, page);
    }
  };
  arena_.execute([&] {
    tbb::parallel_for(tbb::blocked_range<int64_t>(0, n, 64), write_range);
  });
  return MicrosSince(t0);
}

absl::StatusOr<LayerTimings> CpuBackend::DenseTopk(
    const PageLayout& layout, PoolHandle pool_h, const StepRows& rows,
    StepContext* ctx, const QInput& q, int32_t topk, int32_t* out) {
  ASSIGN_OR_RETURN(const Pool p, FindPool(pool_h, layout));
  uint8_t* const pool = p.data;
  RETURN_IF_ERROR(cpu_internal::ValidateOnce(layout, rows, ctx, p.num_pages));
  if (topk < 0) return Bad("topk", ">= 0", topk);
  if (q.num_heads < 1) return Bad("q.num_heads", ">= 1", q.num_heads);
  if (rows.num_rows == 0 || topk == 0) return LayerTimings{};
  RETURN_IF_ERROR(cpu_internal::CheckQ(layout, q));
  if (out == nullptr) {
    return absl::InvalidArgumentError("out: expected a buffer, got null");
  }
  return DenseWalk(layout, pool, rows, q, [&](int32_t r, float* logits) {
    TopkRow(logits, rows.row_visible[r], topk,
            out + static_cast<int64_t>(r) * topk);
  });
}

LayerTimings CpuBackend::DenseWalk(const PageLayout& layout,
                                   const uint8_t* pool, const StepRows& rows,
                                   const QInput& q,
                                   const RowFn& row_fn) const {
  LayerTimings timings;
  std::vector<int64_t> offsets;
  std::vector<float> logits;
  for (const auto& [rb, re] : rows.Chunks()) {
    // Logits of the chunk's rows, packed row after row.
    offsets.assign(static_cast<size_t>(re - rb) + 1, 0);
    for (int32_t r = rb; r < re; ++r) {
      offsets[r - rb + 1] = offsets[r - rb] + rows.row_visible[r];
    }
    logits.resize(static_cast<size_t>(offsets.back()));
    const std::vector<cpu_internal::LogitsTask> tasks =
        cpu_internal::PlanLogitsTasks(rows, rb, re);
    const cpu_internal::LogitsParams params{
        &layout, pool, &rows, &q, rb, offsets.data(), logits.data()};

    Clock::time_point t0 = Clock::now();
    arena_.execute([&] {
      tbb::parallel_for(
          tbb::blocked_range<size_t>(0, tasks.size(), 1),
          [&](const tbb::blocked_range<size_t>& range) {
            for (size_t t = range.begin(); t < range.end(); ++t) {
              cpu_internal::RunLogitsTask(params, tasks[t]);
            }
          });
    });
    timings.logits_us += MicrosSince(t0);

    t0 = Clock::now();
    arena_.execute([&] {
      tbb::parallel_for(tbb::blocked_range<int32_t>(rb, re, 1),
                        [&](const tbb::blocked_range<int32_t>& range) {
                          for (int32_t r = range.begin(); r < range.end();
                               ++r) {
                            row_fn(r, logits.data() + offsets[r - rb]);
                          }
                        });
    });
    timings.topk_us += MicrosSince(t0);
  }
  return timings;
}

absl::Status CpuBackend::ReadEntries(const PageLayout& layout,
                                     PoolHandle pool_h, int32_t page,
                                     int32_t first, int32_t count,
                                     uint8_t* out) {
  ASSIGN_OR_RETURN(const Pool p, FindPool(pool_h, layout));
  uint8_t* const pool = p.data;
  RETURN_IF_ERROR(CheckReadEntriesArgs(layout, p.num_pages, page, first, count, out));
  const uint8_t* src = pool + layout.PageOffset(page);
  for (int32_t i = 0; i < count; ++i) {
    LoadEntry(layout, src, first + i, out + static_cast<int64_t>(i) *
                                               layout.entry_bytes());
  }
  return absl::OkStatus();
}

}  // namespace indexer

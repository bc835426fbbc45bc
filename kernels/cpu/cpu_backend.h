// The cpu backend: the reference implementation of SPEC §3-§5 and the
// embedded default on a machine without a GPU. Work runs in one
// tbb::task_arena of `threads` slots, so the daemon never uses more cores
// than configured.
//
// Memory: pools are zeroed host allocations owned by the backend and freed
// when it is destroyed.
//
// PrepareStep checks the rows' shape; each call checks their pages against
// its pool, once per step and pool size when given the step's context.
// REQUIRES: a call given a context passes the very StepRows object (same
// address, unchanged) that PrepareStep made it from, or a null context.
//
// Candidate path: CandidateSource keeps each row's pool in the step's
// context (so it needs the context PrepareStep made); the set's consumers in
// that step read it and must pass rows with the same visible entries. A
// consumer scores the pool's entries with the very code of the dense walk,
// so its logits are bit-identical to the dense ones and the gathered and
// masked forms give the same output.
//
// Thread safety: as Backend. Every call may run concurrently from several
// threads (they share the arena), also layers of one step; AllocatePool is
// start-up only but is also safe to call concurrently.
#pragma once

#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"
#include "oneapi/tbb/task_arena.h"
#include "kernels/backend.h"
#include "kernels/format/page_layout.h"

namespace indexer {
namespace cpu_internal {
struct CandidatePool;
}  // namespace cpu_internal

class CpuBackend : public Backend {
 public:
  // `threads` 0 = all cores. REQUIRES: threads >= 0.
  explicit CpuBackend(int threads = 0);
  ~CpuBackend() override;
  CpuBackend(const CpuBackend&) = delete;
  CpuBackend& operator=(const CpuBackend&) = delete;

  std::string Describe() const override;
  std::string Kind() const override { return "cpu"; }
  Paths SupportedPaths() const override { return {true, true}; }
  int threads() const { return threads_; }

  absl::StatusOr<PoolHandle> AllocatePool(const PageLayout& layout,
                                        int64_t num_pages) override;
  absl::StatusOr<std::unique_ptr<StepContext>> PrepareStep(
      const PageLayout& layout, StepRows rows) override;
  absl::StatusOr<double> WriteEntries(const PageLayout& layout, PoolHandle pool,
                                      const StepRows& rows, StepContext* ctx,
                                      const KInput& k) override;
  absl::StatusOr<LayerTimings> DenseTopk(const PageLayout& layout,
                                         PoolHandle pool,
                                         const StepRows& rows,
                                         StepContext* ctx, const QInput& q,
                                         int32_t topk, int32_t* out) override;
  absl::StatusOr<LayerTimings> CandidateSource(
      const PageLayout& layout, PoolHandle pool, const StepRows& rows,
      StepContext* ctx, const QInput& q, int32_t topk,
      const CandidateSpec& spec, int32_t* out) override;
  absl::StatusOr<LayerTimings> CandidateConsumer(
      const PageLayout& layout, PoolHandle pool, const StepRows& rows,
      StepContext* ctx, const QInput& q, int32_t topk,
      const CandidateSpec& spec, ConsumerMode mode, int32_t* out) override;
  absl::StatusOr<LayerTimings> BlockTopk(const PageLayout& layout,
                                         PoolHandle pool,
                                         const StepRows& rows,
                                         StepContext* ctx,
                                         const BlockQInput& q,
                                         const BlockSpec& spec,
                                         int32_t* out) override;
  absl::Status ReadEntries(const PageLayout& layout, PoolHandle pool,
                           int32_t page, int32_t first, int32_t count,
                           uint8_t* out) override;

 private:
  struct Pool {
    uint8_t* data;
    int64_t num_pages;
    int64_t page_bytes;
  };
  // The pool of `handle` with pages of `layout`'s size, or INVALID_ARGUMENT.
  absl::StatusOr<Pool> FindPool(PoolHandle handle,
                                const PageLayout& layout) const;

  // Called once per row r with its dense logits [row_visible[r]] fp32, which
  // it may overwrite; rows run concurrently.
  using RowFn = std::function<void(int32_t r, float* logits)>;
  // The dense walk of SPEC §5 (DenseTopk, the candidate source, masked
  // consumers): the logits of every row, chunk by chunk, each handed to
  // `row_fn`. REQUIRES: rows validated against `pool`, q checked.
  LayerTimings DenseWalk(const PageLayout& layout, const uint8_t* pool,
                         const StepRows& rows, const QInput& q,
                         const RowFn& row_fn) const;
  // A consumer that scores only the pool's entries (candidate.cc).
  // out: [num_rows, topk] int32, -1 = no entry.
  LayerTimings GatherConsumer(const PageLayout& layout, const uint8_t* pool,
                              const StepRows& rows, const QInput& q,
                              const cpu_internal::CandidatePool& cands,
                              int32_t topk, int32_t* out) const;

  const int threads_;
  mutable tbb::task_arena arena_;
  mutable absl::Mutex mu_;
  std::vector<Pool> pools_ ABSL_GUARDED_BY(mu_);
};

}  // namespace indexer

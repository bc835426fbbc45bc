// Internals shared by the cpu backend's source files (cpu_backend.cc,
// candidate.cc, block.cc): argument helpers and the backend's step state.
// Not part of the backend's interface.
#pragma once

#include <atomic>
#include <chrono>
#include <cstdint>
#include <map>
#include <memory>
#include <utility>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/status/status.h"
#include "absl/strings/string_view.h"
#include "absl/synchronization/mutex.h"
#include "kernels/backend.h"
#include "kernels/format/page_layout.h"

namespace indexer {
namespace cpu_internal {

using Clock = std::chrono::steady_clock;

double MicrosSince(Clock::time_point t0);

// INVALID_ARGUMENT "<field>: expected <expected>, got <got>".
absl::Status Bad(absl::string_view field, absl::string_view expected,
                 int64_t got);

// INVALID_ARGUMENT unless q has heads and the tensors `layout` needs.
absl::Status CheckQ(const PageLayout& layout, const QInput& q);

// The candidate pools of one set in one step (SPEC §5 "Candidate source"),
// immutable once published. Row r's pool is the ascending block ids
// blocks[row_begin[r], row_begin[r + 1]); block b holds entries
// [b * block_size, (b + 1) * block_size) of the row's sequence, and every
// pool block is causal (b * block_size < row_visible[r]). Only the row's
// newest block can be partial, and it is the largest id, so pool slot j of a
// row (its pool's entries in ascending order) is entry
// blocks[row_begin[r] + j / block_size] * block_size + j % block_size.
struct CandidatePool {
  int32_t block_size = 0;
  int32_t topk_blocks = 0;
  std::vector<int64_t> row_begin;  // [num_rows + 1] prefix sum of pool sizes
  std::vector<int32_t> blocks;     // [row_begin.back()] block ids
  std::vector<int32_t> entries;    // [num_rows] pool entries below n_r
  std::vector<int32_t> row_visible;  // [num_rows] the source's n_r

  int32_t num_rows() const {
    return static_cast<int32_t>(row_begin.size()) - 1;
  }
  int32_t count(int32_t r) const {
    return static_cast<int32_t>(row_begin[r + 1] - row_begin[r]);
  }
  const int32_t* row_blocks(int32_t r) const {
    return blocks.data() + row_begin[r];
  }
};

// The cpu backend's step state: which pool size the step's pages have
// already been checked against (so that the layers after the first skip the
// O(sequences x pages) walk), and the candidate pools of the step's sets.
// Thread safety: every method may be called concurrently.
class CpuStepContext : public StepContext {
 public:
  explicit CpuStepContext(StepRows rows) : StepContext(std::move(rows)) {}

  // True when `rows` is the context's own StepRows object.
  bool Owns(const StepRows& rows) const { return &rows == &this->rows(); }
  bool Checked(const StepRows& rows, int64_t num_pages) const;
  void MarkChecked(const StepRows& rows, int64_t num_pages);

  // Publishes (or replaces) the pools of candidate set `set`.
  void PutPool(int32_t set, std::shared_ptr<const CandidatePool> pool)
      ABSL_LOCKS_EXCLUDED(mu_);
  // The pools of `set`, or null when its source has not run in this step.
  // The pointer stays valid while held, also if a source replaces the set.
  std::shared_ptr<const CandidatePool> GetPool(int32_t set) const
      ABSL_LOCKS_EXCLUDED(mu_);

 private:
  std::atomic<int64_t> checked_pages_{-1};
  mutable absl::Mutex mu_;
  std::map<int32_t, std::shared_ptr<const CandidatePool>> pools_
      ABSL_GUARDED_BY(mu_);
};

// ValidateStepRows, once per step and pool size when `ctx` is ours.
absl::Status ValidateOnce(const PageLayout& layout, const StepRows& rows,
                          StepContext* ctx, int64_t num_pages);

}  // namespace cpu_internal
}  // namespace indexer

// The gpu backend's per-step state (GpuBackend::Step), shared by the
// backend's sources (gpu_backend.cc, gpu_layers.cc). Internal.
#pragma once

#include <cstdint>
#include <map>
#include <string>
#include <utility>
#include <vector>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/synchronization/mutex.h"
#include "kernels/common/status_macros.h"
#include "kernels/geometry/step_geometry.h"
#include "kernels/gpu/gpu_backend_impl.h"

namespace indexer {
namespace gpu {

// Device state of one step: the metadata image in the arena and the plan,
// made from rows validated once (MakeStep).
class GpuBackend::Step : public StepContext {
 public:
  // Takes the rows (PrepareStep's are moved in, not copied: a B=64 x 32k
  // step's block table alone is 128 KiB).
  Step(DeviceArena* arena, uint8_t* meta, StepPlan plan, DeviceStepRows dev,
       StepRows rows, int64_t max_page)
      : StepContext(std::move(rows)), arena_(arena), meta_(meta), plan_(std::move(plan)),
        dev_(dev), num_rows_(this->rows().num_rows), num_seqs_(this->rows().num_seqs),
        max_pages_(this->rows().max_pages), new_entries_(this->rows().NewEntries()),
        max_page_(max_page) {}
  ~Step() override {
    arena_->Release(meta_);
    for (auto& [entries, map] : block_maps_) {
      if (map.mem != nullptr) arena_->Release(map.mem);
    }
    for (auto& [set, pool] : pools_) {
      arena_->Release(pool.mem);
      if (pool.gather_mem != nullptr) arena_->Release(pool.gather_mem);
    }
  }

  // Candidate pools of the step's sets, in device memory from the arena
  // (SPEC §5): [rows, topk_blocks] ascending block ids and [rows] entries.
  struct CandPool {
    int32_t block_size = 0;
    int32_t topk_blocks = 0;
    uint8_t* mem = nullptr;       // arena allocation holding both arrays
    int32_t* blocks = nullptr;
    int32_t* entries = nullptr;
    std::vector<int32_t> row_visible;  // the rows the source ran on
    // The consumers' gather walk, made by the first consumer of the step
    // that gathers (it depends only on the rows and the pool size): device
    // groups and units in one arena allocation, and the unit range of each
    // sub-chunk of the step's plan.
    uint8_t* gather_mem = nullptr;
    const LogitsGroup* gather_groups = nullptr;
    const LogitsUnit* gather_units = nullptr;
    std::vector<std::pair<int32_t, int32_t>> gather_ranges;
    std::vector<LogitsGroup> gather_host_groups;  // their host images (the
    std::vector<LogitsUnit> gather_host_units;    // uploads read them)
  };
  // Publishes `pool` under `set` (replacing and releasing an earlier one).
  void PutPool(int32_t set, CandPool pool) {
    absl::MutexLock lock(&pools_mu_);
    auto it = pools_.find(set);
    if (it != pools_.end()) {
      arena_->Release(it->second.mem);
      if (it->second.gather_mem != nullptr) arena_->Release(it->second.gather_mem);
      it->second = std::move(pool);
    } else {
      pools_.emplace(set, std::move(pool));
    }
  }
  // A copy of the pool of `set`, or null when its source has not run.
  // REQUIRES: the step's layers run one at a time (the engine's order).
  const CandPool* GetPool(int32_t set) const {
    absl::MutexLock lock(&pools_mu_);
    auto it = pools_.find(set);
    return it == pools_.end() ? nullptr : &it->second;
  }
  // The pool of `set` to attach its gather walk to, or null.
  // REQUIRES: as GetPool.
  CandPool* MutablePool(int32_t set) {
    absl::MutexLock lock(&pools_mu_);
    auto it = pools_.find(set);
    return it == pools_.end() ? nullptr : &it->second;
  }
  DeviceArena* arena() const { return arena_; }

  // MakeStep's phases, in microseconds (PrepareParts prints them).
  struct Parts {
    double validate = 0, plan = 0, image = 0, arena = 0, wait = 0, upload = 0;
    int64_t image_bytes = 0;
  };
  void set_parts(const Parts& p) { parts_ = p; }
  std::string PrepareParts() const override {
    return absl::StrFormat(
        "validate %.1f us, plan %.1f us (%d units), image %.1f us (%d KiB), arena %.1f us, "
        "wait for the stream %.1f us, upload %.1f us",
        parts_.validate, parts_.plan, static_cast<int>(plan_.units.size()), parts_.image,
        static_cast<int>(parts_.image_bytes / 1024), parts_.arena, parts_.wait, parts_.upload);
  }

  // The block path's work map for pages of one size (plan.h:
  // PlanBlockWork), made by the step's first block layer of that size and
  // shared by the others: device starts and CTA pairs in one arena
  // allocation, the sub-chunks' offsets into the pairs.
  struct BlockMap {
    uint8_t* mem = nullptr;
    const int32_t* starts = nullptr;
    const int32_t* cta = nullptr;
    int32_t ctas = 0;
    std::vector<int64_t> cta_offsets;
    std::vector<int32_t> host;  // starts then pairs: the upload's source
  };
  // The map of `page_entries` (empty, mem null, until made).
  // REQUIRES: as GetPool.
  BlockMap* MutableBlockMap(int32_t page_entries) {
    absl::MutexLock lock(&pools_mu_);
    return &block_maps_[page_entries];
  }

  const StepPlan& plan() const { return plan_; }
  const DeviceStepRows& dev() const { return dev_; }
  bool Matches(const StepRows& rows) const {
    return rows.num_rows == num_rows_ && rows.num_seqs == num_seqs_ &&
           rows.max_pages == max_pages_ && rows.NewEntries() == new_entries_;
  }
  // The step's pages against a pool of `num_pages`: O(1); the full walk
  // only to name the offending page.
  absl::Status CheckPages(const PageLayout& layout, const StepRows& rows,
                          int64_t num_pages) const {
    if (max_page_ < num_pages) return absl::OkStatus();
    RETURN_IF_ERROR(ValidateStepRows(layout, rows, num_pages));
    return absl::InvalidArgumentError(absl::StrCat(
        "block_table: expected pages in [0, ", num_pages, "), got ", max_page_));
  }

 private:
  DeviceArena* const arena_;
  uint8_t* const meta_;
  const StepPlan plan_;
  const DeviceStepRows dev_;
  const int32_t num_rows_, num_seqs_, max_pages_;
  const int64_t new_entries_, max_page_;
  Parts parts_;
  mutable absl::Mutex pools_mu_;
  std::map<int32_t, CandPool> pools_ ABSL_GUARDED_BY(pools_mu_);
  std::map<int32_t, BlockMap> block_maps_ ABSL_GUARDED_BY(pools_mu_);
};

}  // namespace gpu
}  // namespace indexer

// The daemon's metrics (issue 13): counters and latency histograms that the
// hot path updates with relaxed atomics only (no lock, no allocation, no
// formatting), and their Prometheus text exposition (format 0.0.4), built
// on a scrape. Gauges that the engine already knows (pages, sequences, open
// steps) are read at scrape time instead of being kept up to date here.
//
// Thread safety: every method may be called from any thread.
#pragma once

#include <array>
#include <atomic>
#include <cstdint>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "server/core/model.h"

namespace indexer {

// A fixed-bucket histogram of durations in microseconds, exposed in seconds.
class LatencyHistogram {
 public:
  // Upper bounds (us) of the finite buckets; a last one catches the rest.
  static constexpr std::array<double, 18> kBoundsUs = {
      10,    25,    50,     100,    250,    500,     1000,    2500,    5000,
      10000, 25000, 50000, 100000, 250000, 500000, 1000000, 2500000, 10000000};

  void Observe(double us);

  struct Snapshot {
    std::array<uint64_t, kBoundsUs.size() + 1> buckets{};  // per bucket, not cumulative
    uint64_t count = 0;                                    // = sum of buckets
    double sum_us = 0;
  };
  Snapshot Read() const;

 private:
  std::array<std::atomic<uint64_t>, kBoundsUs.size() + 1> buckets_{};
  std::atomic<uint64_t> sum_ns_{0};  // integer: fetch_add, no CAS loop
};

enum class StepOutcome { kCommitted, kAborted, kFailed };
enum class Rejection { kQuota, kLimits };
// The server-side phases of a layer, as in v1::LayerTimings.
enum class LayerPhase { kQueue, kValidate, kWrite, kLogits, kTopk, kTotal };

inline constexpr int kNumRoles = 4;   // LayerRoleKind
inline constexpr int kNumPhases = 6;  // LayerPhase

// The phases of one layer (us), as the transport measured them.
struct LayerPhaseTimes {
  double queue_us = 0, validate_us = 0, write_us = 0, logits_us = 0, topk_us = 0, total_us = 0;
};

// What a scrape reads from the engine (engine.h fills it).
struct MetricsGauges {
  struct Group {
    std::string name;
    int64_t total_pages = 0;  // per layer
    int64_t free_pages = 0;
  };
  std::vector<Group> groups;
  int64_t sequences = 0;
  int64_t open_steps = 0;
  // The process's malloc heap (ReadProcessHeap).
  struct Heap {
    bool known = false;    // false where the C library cannot say (not glibc)
    int64_t in_use = 0;    // bytes handed out by malloc and not freed
    int64_t free_kept = 0; // freed bytes the allocator keeps for reuse
  } heap;
};

// The malloc heap now, from glibc's mallinfo2() (every arena; mmapped
// chunks count as in use). What a leak of heap memory grows is `in_use`;
// `free_kept` is what the allocator holds for the next large message by
// design (proto/transport_tuning.h), which counts in the RSS without
// being live. Takes each arena's lock briefly: for scrapes, not hot paths.
MetricsGauges::Heap ReadProcessHeap();

class Metrics {
 public:
  void StepEnded(StepOutcome o) { steps_[static_cast<int>(o)].fetch_add(1, kRelaxed); }
  void ImportEnded(bool ok) { imports_[ok ? 0 : 1].fetch_add(1, kRelaxed); }
  void Rejected(Rejection r) { rejections_[static_cast<int>(r)].fetch_add(1, kRelaxed); }
  // Counts `s` when it is a device failure (kernel, copy, allocation: the
  // codes a backend returns for those); input errors are not.
  void MaybeDeviceError(const absl::Status& s);
  void BytesIn(int64_t n) { bytes_in_.fetch_add(static_cast<uint64_t>(n), kRelaxed); }
  void BytesOut(int64_t n) { bytes_out_.fetch_add(static_cast<uint64_t>(n), kRelaxed); }
  void LayerDone(LayerRoleKind role, const LayerPhaseTimes& t);
  // Inline tensor bytes of Step layers (indexer_inline_tensor_bytes_total):
  // received (`in`: k, q, q_scale, weights) or sent (the top-k), through a
  // buffer the backend lent (`lent`: one copy from or to gRPC's slices,
  // pinned on the gpu backend) or through ordinary memory (`copied`).
  void InlineTensorBytes(bool in, bool lent, int64_t n) {
    inline_bytes_[(in ? 0 : 2) + (lent ? 0 : 1)].fetch_add(static_cast<uint64_t>(n), kRelaxed);
  }
  uint64_t inline_tensor_bytes(bool in, bool lent) const {
    return inline_bytes_[(in ? 0 : 2) + (lent ? 0 : 1)].load(kRelaxed);
  }

  uint64_t steps(StepOutcome o) const { return steps_[static_cast<int>(o)].load(kRelaxed); }
  uint64_t rejections(Rejection r) const {
    return rejections_[static_cast<int>(r)].load(kRelaxed);
  }
  uint64_t device_errors() const { return device_errors_.load(kRelaxed); }
  LatencyHistogram::Snapshot layer(LayerRoleKind role, LayerPhase phase) const {
    return layers_[static_cast<int>(role)][static_cast<int>(phase)].Read();
  }

  // The exposition: these counters and histograms, `gauges`, and an info
  // metric with `profile` and `device`.
  std::string Render(const MetricsGauges& gauges, const std::string& profile,
                     const std::string& device) const;

 private:
  static constexpr std::memory_order kRelaxed = std::memory_order_relaxed;
  std::array<std::atomic<uint64_t>, 3> steps_{};
  std::array<std::atomic<uint64_t>, 2> imports_{};  // ok, failed
  std::array<std::atomic<uint64_t>, 2> rejections_{};
  std::atomic<uint64_t> device_errors_{0};
  std::atomic<uint64_t> bytes_in_{0};
  std::atomic<uint64_t> bytes_out_{0};
  std::array<std::atomic<uint64_t>, 4> inline_bytes_{};  // in lent, in copied, out lent, out copied
  std::array<std::array<LatencyHistogram, kNumPhases>, kNumRoles> layers_;
};

}  // namespace indexer

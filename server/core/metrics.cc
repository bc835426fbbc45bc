#include "server/core/metrics.h"

#include <malloc.h>

#include <algorithm>
#include <cmath>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"

namespace indexer {

void LatencyHistogram::Observe(double us) {
  if (!(us >= 0)) us = 0;  // NaN and clock steps count as 0
  const size_t b = static_cast<size_t>(
      std::lower_bound(kBoundsUs.begin(), kBoundsUs.end(), us) - kBoundsUs.begin());
  buckets_[b].fetch_add(1, std::memory_order_relaxed);
  sum_ns_.fetch_add(static_cast<uint64_t>(std::llround(std::min(us, 1e12) * 1000.0)),
                    std::memory_order_relaxed);
}

LatencyHistogram::Snapshot LatencyHistogram::Read() const {
  Snapshot s;
  for (size_t i = 0; i < buckets_.size(); ++i) {
    s.buckets[i] = buckets_[i].load(std::memory_order_relaxed);
    s.count += s.buckets[i];
  }
  s.sum_us = static_cast<double>(sum_ns_.load(std::memory_order_relaxed)) / 1000.0;
  return s;
}

void Metrics::MaybeDeviceError(const absl::Status& s) {
  switch (s.code()) {
    case absl::StatusCode::kInternal:
    case absl::StatusCode::kUnavailable:
    case absl::StatusCode::kDataLoss:
    case absl::StatusCode::kUnknown:
      device_errors_.fetch_add(1, kRelaxed);
      break;
    default:
      break;
  }
}

void Metrics::LayerDone(LayerRoleKind role, const LayerPhaseTimes& t) {
  auto& h = layers_[static_cast<int>(role)];
  h[static_cast<int>(LayerPhase::kQueue)].Observe(t.queue_us);
  h[static_cast<int>(LayerPhase::kValidate)].Observe(t.validate_us);
  h[static_cast<int>(LayerPhase::kWrite)].Observe(t.write_us);
  h[static_cast<int>(LayerPhase::kLogits)].Observe(t.logits_us);
  h[static_cast<int>(LayerPhase::kTopk)].Observe(t.topk_us);
  h[static_cast<int>(LayerPhase::kTotal)].Observe(t.total_us);
}

MetricsGauges::Heap ReadProcessHeap() {
  MetricsGauges::Heap h;
#if defined(__GLIBC__) && (__GLIBC__ > 2 || (__GLIBC__ == 2 && __GLIBC_MINOR__ >= 33))
  const struct mallinfo2 mi = mallinfo2();
  h.known = true;
  h.in_use = static_cast<int64_t>(mi.uordblks + mi.hblkhd);
  h.free_kept = static_cast<int64_t>(mi.fordblks);
#endif
  return h;
}

namespace {

// Label values: backslash, double quote and newline escaped (exposition
// format 0.0.4).
std::string Label(const std::string& v) {
  std::string out;
  for (char c : v) {
    if (c == '\\' || c == '"') {
      out += '\\';
      out += c;
    } else if (c == '\n') {
      out += "\\n";
    } else {
      out += c;
    }
  }
  return out;
}

void Head(std::string* out, const char* name, const char* type, const char* help) {
  absl::StrAppend(out, "# HELP ", name, " ", help, "\n# TYPE ", name, " ", type, "\n");
}

// Seconds, shortest exact-enough form ("1e-05", "0.25", "10").
std::string Seconds(double us) { return absl::StrFormat("%g", us / 1e6); }

constexpr const char* kPhaseNames[kNumPhases] = {"queue", "validate", "write",
                                                 "logits", "topk", "total"};
constexpr LayerRoleKind kRoles[kNumRoles] = {
    LayerRoleKind::kDense, LayerRoleKind::kCandidateSource, LayerRoleKind::kCandidateConsumer,
    LayerRoleKind::kBlock};

}  // namespace

std::string Metrics::Render(const MetricsGauges& g, const std::string& profile,
                            const std::string& device) const {
  std::string out;
  Head(&out, "indexer_info", "gauge", "The served profile and device (value 1).");
  absl::StrAppend(&out, "indexer_info{profile=\"", Label(profile), "\",device=\"", Label(device),
                  "\"} 1\n");

  Head(&out, "indexer_steps_total", "counter",
       "Steps ended, by outcome: committed; aborted by the client (abort, cancel, stream "
       "closed before commit); failed (an error status, an idle timeout).");
  const char* outcomes[] = {"committed", "aborted", "failed"};
  for (int i = 0; i < 3; ++i) {
    absl::StrAppend(&out, "indexer_steps_total{outcome=\"", outcomes[i], "\"} ",
                    steps_[i].load(kRelaxed), "\n");
  }
  Head(&out, "indexer_imports_total", "counter", "WriteEntries calls, by outcome.");
  absl::StrAppend(&out, "indexer_imports_total{outcome=\"ok\"} ", imports_[0].load(kRelaxed),
                  "\nindexer_imports_total{outcome=\"failed\"} ", imports_[1].load(kRelaxed),
                  "\n");
  Head(&out, "indexer_admission_rejections_total", "counter",
       "Calls refused with RESOURCE_EXHAUSTED: by a client quota (client_quota.*), or by a "
       "daemon limit (max_open_steps, free pages).");
  absl::StrAppend(&out, "indexer_admission_rejections_total{reason=\"quota\"} ",
                  rejections_[0].load(kRelaxed),
                  "\nindexer_admission_rejections_total{reason=\"limits\"} ",
                  rejections_[1].load(kRelaxed), "\n");
  Head(&out, "indexer_device_errors_total", "counter",
       "Backend failures of the device (INTERNAL, UNAVAILABLE, DATA_LOSS, UNKNOWN).");
  absl::StrAppend(&out, "indexer_device_errors_total ", device_errors_.load(kRelaxed), "\n");
  Head(&out, "indexer_received_bytes_total", "counter",
       "Request bytes of Step and WriteEntries calls.");
  absl::StrAppend(&out, "indexer_received_bytes_total ", bytes_in_.load(kRelaxed), "\n");
  Head(&out, "indexer_sent_bytes_total", "counter", "Reply bytes of Step calls.");
  absl::StrAppend(&out, "indexer_sent_bytes_total ", bytes_out_.load(kRelaxed), "\n");
  Head(&out, "indexer_inline_tensor_bytes_total", "counter",
       "Inline tensor bytes of Step layers: in (k, q, q_scale, weights) or out (top-k), "
       "through a buffer the backend lent (one copy, pinned on gpu) or copied.");
  for (int i = 0; i < 4; ++i) {
    absl::StrAppend(&out, "indexer_inline_tensor_bytes_total{direction=\"", i < 2 ? "in" : "out",
                    "\",path=\"", i % 2 == 0 ? "lent" : "copied", "\"} ",
                    inline_bytes_[i].load(kRelaxed), "\n");
  }

  Head(&out, "indexer_pages_free", "gauge", "Free pages per layer of each layer group.");
  for (const auto& gr : g.groups) {
    absl::StrAppend(&out, "indexer_pages_free{group=\"", Label(gr.name), "\"} ", gr.free_pages,
                    "\n");
  }
  Head(&out, "indexer_pages_used", "gauge",
       "Pages per layer held by sequences and open steps, per layer group.");
  for (const auto& gr : g.groups) {
    absl::StrAppend(&out, "indexer_pages_used{group=\"", Label(gr.name), "\"} ",
                    gr.total_pages - gr.free_pages, "\n");
  }
  Head(&out, "indexer_sequences", "gauge", "Sequences held.");
  absl::StrAppend(&out, "indexer_sequences ", g.sequences, "\n");
  Head(&out, "indexer_open_steps", "gauge", "Steps open now.");
  absl::StrAppend(&out, "indexer_open_steps ", g.open_steps, "\n");
  if (g.heap.known) {
    Head(&out, "indexer_heap_bytes", "gauge",
         "The process's malloc heap: in_use (allocated, not freed) and free_kept (freed, kept "
         "by the allocator for reuse).");
    absl::StrAppend(&out, "indexer_heap_bytes{state=\"in_use\"} ", g.heap.in_use,
                    "\nindexer_heap_bytes{state=\"free_kept\"} ", g.heap.free_kept, "\n");
  }

  Head(&out, "indexer_layer_duration_seconds", "histogram",
       "Server-side time of a Step layer by role and phase: queue (receipt to start), "
       "validate, write (new entries), logits, topk, total (receipt to reply).");
  for (LayerRoleKind role : kRoles) {
    for (int p = 0; p < kNumPhases; ++p) {
      const LatencyHistogram::Snapshot s = layers_[static_cast<int>(role)][p].Read();
      const std::string labels =
          absl::StrCat("role=\"", LayerRoleName(role), "\",phase=\"", kPhaseNames[p], "\"");
      uint64_t cumulative = 0;
      for (size_t b = 0; b < LatencyHistogram::kBoundsUs.size(); ++b) {
        cumulative += s.buckets[b];
        absl::StrAppend(&out, "indexer_layer_duration_seconds_bucket{", labels, ",le=\"",
                        Seconds(LatencyHistogram::kBoundsUs[b]), "\"} ", cumulative, "\n");
      }
      absl::StrAppend(&out, "indexer_layer_duration_seconds_bucket{", labels, ",le=\"+Inf\"} ",
                      s.count, "\n", "indexer_layer_duration_seconds_sum{", labels, "} ",
                      absl::StrFormat("%.9g", s.sum_us / 1e6), "\n",
                      "indexer_layer_duration_seconds_count{", labels, "} ", s.count, "\n");
    }
  }
  return out;
}

}  // namespace indexer

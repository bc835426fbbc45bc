// The daemon's core: sequence registry, page allocators, K pools and steps
// (SPEC §4, §6). No gRPC here; server/rpc is a thin transport over it.
//
// Atomicity: a Step allocates its pages up front and writes new entries only
// past each sequence's committed length, so abort just returns the pages and
// unlocks the sequences: every sequence is left exactly as it was.
//
// Thread safety: Engine is thread-safe. A Step is used by one caller at a
// time (one gRPC stream); steps over other sequences run concurrently.
#pragma once

#include <atomic>
#include <chrono>
#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "absl/container/flat_hash_map.h"
#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"
#include "kernels/backend.h"
#include "server/core/metrics.h"
#include "server/core/model.h"
#include "server/core/page_allocator.h"
#include "server/core/tensor.h"

namespace indexer {

// A client-named sequence. `key` is the registry key (namespace + id), and
// `display` the form used in messages ("7", "\"chat-3\"").
struct SeqName {
  std::string key;
  std::string display;
  static SeqName Numeric(uint64_t id, const std::string& ns = "");
  static SeqName Named(const std::string& name, const std::string& ns = "");
};

struct StepSequenceSpec {
  SeqName name;
  int64_t q_len = 0;
  bool create = false;
};

struct StepSpec {
  std::vector<StepSequenceSpec> seqs;
  std::string request_id;  // for logs
};

struct LayerInput {
  int32_t layer = -1;
  TensorView k;        // new entries
  TensorView q;        // index queries
  TensorView q_scale;  // MXFP4 Q scales
  TensorView weights;  // head weights
  // Optional: the indices are written here (resized to 4 bytes each, host
  // byte order = the wire's little-endian) instead of LayerOutput::indices,
  // e.g. straight into the reply's tensor bytes. Unspecified on failure.
  std::string* out_bytes = nullptr;
  // Optional, before out_bytes: the indices go into a buffer lent by the
  // backend's host_buffers() (pinned on the gpu backend: downloaded into it
  // directly), left in *out_lease with its size() the output's bytes. When
  // the pool has no room the lease stays empty and out_bytes is used.
  HostLease* out_lease = nullptr;
  // Optional: where the indices go instead (LayerRequest.topk_out), exactly
  // the output shape x 4 bytes (INVALID_ARGUMENT "topk_out.bytes" before
  // any work otherwise): device memory of the daemon's device (a device
  // region; gpu backend, no download) or host memory (a host region).
  // Unspecified on failure.
  void* out_device = nullptr;
  int64_t out_device_bytes = 0;
  uint8_t* out_host = nullptr;
  int64_t out_host_bytes = 0;
};

struct LayerOutput {
  // [rows, topk] (dense, candidate roles) or [Hi, rows, topk_blocks] (block).
  std::vector<int64_t> shape;
  std::vector<int32_t> indices;  // -1 = no entry (empty with out_bytes)
  double validate_us = 0;
  LayerTimings timings;
};

class Engine;

class Step {
 public:
  Step(const Step&) = delete;
  Step& operator=(const Step&) = delete;
  ~Step();  // aborts unless committed

  const std::string& id() const { return id_; }
  int32_t num_rows() const;
  // [group] pages this step allocated, held until it ends (client quotas).
  // Host time of BeginStep's parts, in us: admission and pages (under the
  // engine's lock), the groups' rows, the backend's PrepareStep (on the gpu
  // the plan and the metadata upload). For logs at debug level.
  struct BeginTimes {
    double admit_us = 0, rows_us = 0, prepare_us = 0;
  };
  const BeginTimes& begin_times() const { return begin_times_; }
  // The backend's own split of its prepare, per layer group ("" when the
  // backend does not say); built on demand (the daemon's debug log).
  std::string PrepareParts() const;
  std::vector<int64_t> reserved_pages() const;

  // Validates the layer's inputs, writes its new entries and returns its
  // top-k. On error nothing visible changes (the step itself stays open; the
  // transport aborts it).
  absl::StatusOr<LayerOutput> RunLayer(const LayerInput& in);
  // Writes the layer's new entries only (bulk import).
  absl::Status WriteLayer(int32_t layer, const TensorView& k);
  // Commits: FAILED_PRECONDITION unless every layer ran. Returns the
  // sequences' lengths after the step, in spec order.
  absl::StatusOr<std::vector<int64_t>> Commit();
  // Rolls back. Idempotent.
  void Abort();

 private:
  BeginTimes begin_times_;
  friend class Engine;
  explicit Step(Engine* engine);

  absl::Status CheckLayer(int32_t layer) const;
  // Writes validated new entries of `layer`; returns the backend's time (us).
  absl::StatusOr<double> WriteK(int32_t group, int32_t layer, const KInput& k);

  Engine* engine_;
  std::string id_;
  bool finished_ = false;
  std::vector<std::string> keys_;          // registry keys, spec order
  std::vector<bool> created_;
  std::vector<int64_t> new_len_;
  // [seq][group] pages allocated by this step.
  std::vector<std::vector<std::vector<int32_t>>> new_pages_;
  // [group] the backend's step state, which owns the group's StepRows.
  std::vector<std::unique_ptr<StepContext>> ctx_;
  int32_t num_rows_ = 0;
  std::vector<bool> layer_done_;                     // [layer]
  std::vector<bool> source_done_;                    // [candidate set]
  // Reused per layer: quantized Q, scales and scaled weights.
  std::vector<uint8_t> q_values_, q_scales_;
  std::vector<float> weights_;
  std::vector<float> block_q_;
  // Host copies of device inputs that need host work.
  std::string staged_q_, staged_q_scale_, staged_weights_;
};

struct GroupUsage {
  int64_t total_pages = 0;
  int64_t free_pages = 0;
};

// One sequence of a namespace, as ListSequences shows it.
struct SequenceListing {
  bool numeric = false;  // id: `num` when numeric, else `name`
  uint64_t num = 0;
  std::string name;
  int64_t length = 0;             // committed tokens
  std::vector<int64_t> pages;     // [group] pages held
  int64_t idle_ms = 0;            // since its last use
  bool busy = false;              // in an open step
};
struct SequencePage {
  std::vector<SequenceListing> sequences;
  std::string next_cursor;  // "" = no more
};

// A committed sequence being exported (ExportEntries): pinned until this is
// destroyed, so that Release refuses it (FAILED_PRECONDITION) and the idle
// TTL skips it. Steps may extend the sequence meanwhile: they write only
// past the committed length, and the export ends at the length it had when
// it began. Not thread-safe (one stream drives it); REQUIRES: destroyed
// before the Engine.
class SequenceExport {
 public:
  SequenceExport(const SequenceExport&) = delete;
  SequenceExport& operator=(const SequenceExport&) = delete;
  ~SequenceExport();

  int64_t length() const { return len_; }
  bool done() const { return next_token_ >= len_; }

  // The next chunk: tokens [first_token, first_token + num_tokens) and, per
  // layer (layer order), their entries in the [n_new, VB + SB] linear form
  // WriteEntries accepts. num_tokens is the largest count up to
  // `max_tokens` whose entries take at most `max_payload_bytes` over all
  // layers; INVALID_ARGUMENT naming `bytes_field` when not even one token
  // fits. Errors leave the position where it was.
  struct Chunk {
    int64_t first_token = 0;
    int64_t num_tokens = 0;
    std::vector<std::string> layers;  // [layer]
  };
  absl::StatusOr<Chunk> Next(int64_t max_payload_bytes, int64_t max_tokens,
                             const std::string& bytes_field);

 private:
  friend class Engine;
  SequenceExport(Engine* engine, std::string key) : engine_(engine), key_(std::move(key)) {}

  Engine* engine_;
  const std::string key_;
  int64_t len_ = 0;
  std::vector<std::vector<int32_t>> pages_;  // [group] block table up to len_
  int64_t next_token_ = 0;
};

class Engine {
 public:
  // Allocates every K pool up front.
  static absl::StatusOr<std::unique_ptr<Engine>> Create(
      Model model, std::unique_ptr<Backend> backend);

  // Validates the batch, locks its sequences, allocates its pages and builds
  // the per-step metadata of every group. Errors change nothing.
  absl::StatusOr<std::unique_ptr<Step>> BeginStep(const StepSpec& spec);

  // Drops sequences (all or none): NOT_FOUND for an unknown one,
  // FAILED_PRECONDITION for one in an open step. Returns pages freed.
  absl::StatusOr<int64_t> Release(const std::vector<SeqName>& names);

  // Bulk import: appends `num_tokens` tokens with one K tensor per layer.
  absl::StatusOr<int64_t> Import(const SeqName& name, bool create,
                                 int64_t num_tokens,
                                 const std::vector<std::pair<int32_t, TensorView>>& layers);

  // ---- lifecycle (SPEC §9; README "Lifecycle") ----

  // The sequences of namespace `ns` (SeqName's), ordered by id, after
  // `cursor` (a next_cursor of an earlier call; "" = from the start), at
  // most `limit`. INVALID_ARGUMENT naming page_token for a cursor this
  // method did not make.
  absl::StatusOr<SequencePage> ListSequences(const std::string& ns, const std::string& cursor,
                                             size_t limit) const;

  // Pins a committed sequence for export. NOT_FOUND for an unknown one,
  // FAILED_PRECONDITION for one created by a step still open (nothing
  // committed yet), UNAVAILABLE after a sticky device error.
  absl::StatusOr<std::unique_ptr<SequenceExport>> Export(const SeqName& name);

  // Releases every sequence no step, import or export has used since
  // before `now` - sequence_idle_ttl_ms, skipping sequences in an open step
  // or being exported. Returns how many; 0 when the TTL is off. The server
  // calls it periodically; tests pass a `now` of their choice.
  int64_t ReleaseIdle(std::chrono::steady_clock::time_point now);
  // Sequences the idle TTL released since start (a counter for metrics).
  int64_t idle_released() const { return idle_released_.load(); }

  // A sticky device error (a backend reports it as UNAVAILABLE, see
  // kernels/gpu/gpu_compat.h ErrorStatus): the device is lost for this
  // process. The first one calls `handler` (once, on the failing call's
  // thread) and from then on steps, imports and exports are refused with
  // UNAVAILABLE. REQUIRES: set before serving.
  void SetDeviceErrorHandler(std::function<void(const absl::Status&)> handler) {
    device_error_handler_ = std::move(handler);
  }
  bool device_failed() const { return device_errors_.load() > 0; }
  // Sticky device errors seen (a counter for metrics).
  int64_t device_errors() const { return device_errors_.load(); }

  const Model& model() const { return model_; }
  Backend& backend() { return *backend_; }
  std::vector<GroupUsage> Usage() const;
  // Counters and histograms the engine and its transport update.
  Metrics& metrics() { return metrics_; }
  // The gauges a metrics scrape reads (one lock).
  MetricsGauges Gauges() const;
  int64_t num_sequences() const;
  int32_t open_steps() const { return open_steps_.load(); }
  // Tokens held by a sequence; NOT_FOUND if unknown.
  absl::StatusOr<int64_t> SequenceLength(const SeqName& name) const;
  // Allocator invariants plus: pages held by sequences and open steps equal
  // used pages; every sequence holds exactly ceil(entries / E) pages.
  absl::Status CheckInvariants() const;
  // Pool base of a layer (tests read entries back through the backend).
  PoolHandle pool(int32_t layer) const { return pools_[layer]; }
  // Physical pages of a committed sequence in a group, for tests.
  absl::StatusOr<std::vector<int32_t>> SequencePages(const SeqName& name,
                                                     int32_t group) const;

 private:
  friend class Step;
  friend class SequenceExport;
  using Clock = std::chrono::steady_clock;
  struct Sequence {
    int64_t len = 0;                          // tokens
    std::vector<std::vector<int32_t>> pages;  // [group] block table
    bool busy = false;                        // in an open step
    int32_t exports = 0;                      // SequenceExports pinning it
    Clock::time_point last_used = Clock::now();  // idle TTL
  };
  Engine(Model model, std::unique_ptr<Backend> backend);
  void FinishStep(Step* step, bool commit);
  // Passes `s` through; counts and reports it when it is a sticky device
  // error (UNAVAILABLE from the backend).
  absl::Status NoteDeviceStatus(absl::Status s);
  absl::Status CheckDevice() const;
  void EndExport(const std::string& key);

  const Model model_;
  const std::unique_ptr<Backend> backend_;
  std::vector<PoolHandle> pools_;  // [layer]
  std::atomic<int32_t> open_steps_{0};
  std::atomic<uint64_t> step_counter_{0};
  Metrics metrics_;
  std::atomic<int64_t> idle_released_{0};
  std::atomic<int64_t> device_errors_{0};
  std::function<void(const absl::Status&)> device_error_handler_;

  mutable absl::Mutex mu_;
  std::vector<PageAllocator> allocators_ ABSL_GUARDED_BY(mu_);  // [group]
  absl::flat_hash_map<std::string, std::unique_ptr<Sequence>> seqs_
      ABSL_GUARDED_BY(mu_);
};

}  // namespace indexer

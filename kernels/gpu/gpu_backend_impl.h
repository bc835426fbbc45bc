// The gpu backend (CUDA sm_90 / HIP gfx942, gfx950): Backend on one device.
//
// Memory: everything is taken at start-up. The constructor takes the
// workspace (logits of one sub-chunk, Q / K / output staging, top-k
// candidates, the per-step metadata arena) and two pinned host buffers that
// stage uploads (K, Q, weights, step metadata) and top-k downloads, so those
// copies run asynchronously; inputs or outputs that do not fit them go
// through the caller's pageable memory. AllocatePool takes the pools.
// Requests only sub-allocate from the arena.
// Workspace size: env INDEXER_GPU_LOGITS_MB (default 1024) bounds one
// sub-chunk's logits; steps whose chunks exceed it are cut into sub-chunks.
//
// Steps: PrepareStep validates the rows in full, copies them to the device
// and keeps them in the context; RunLayer takes them from there. A
// single-path call given a context checks only that the context is this
// backend's for rows of that shape and that the step's pages lie in the
// pool (O(1)). REQUIRES: such a call passes rows equal to the context's
// (the kernels read the copy made by PrepareStep). A single-path call with
// a null context validates and copies the rows itself.
//
// Synchronization: each call waits for the stream once, at its end, also
// when it fails (its kernel times and outputs are then ready and the
// caller's buffers no longer used). RunLayer enqueues a whole layer (K
// upload, write kernel, Q upload, logits, top-k, download) and so waits once
// per layer; its timings come from events between the stages, read after
// that wait. (A call that runs out of its kEvents / 2 timed spans waits once
// more to recycle them: only long prefill steps do.) PrepareStep waits only
// when its metadata does not fit the staging.
//
// Device tensors (on_device inputs, out_on_device): read and written in
// place on the stream; device K, weights and Q are checked on the device in
// one launch whose last block stores the verdict in mapped pinned memory,
// read after the call's wait (INVALID_ARGUMENT naming the field): no reset
// and no copy enqueued for it.
//
// Thread safety: as Backend. Device work of concurrent calls is serialized
// on the backend's one stream (one workspace, one pinned staging) under mu_;
// PrepareStep only holds it for its metadata copy.
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/functional/function_ref.h"
#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"
#include "kernels/backend.h"
#include "kernels/gpu/device_arena.h"
#include "kernels/gpu/gpu_compat.h"
#include "kernels/gpu/params.h"
#include "kernels/gpu/plan.h"

namespace indexer {
namespace gpu {

struct Workspace {
  int64_t logits_floats = 0;
  int32_t max_rows = 8192;       // rows of one sub-chunk
  int32_t max_heads = 128;       // H the Q staging is sized for
  int64_t q_bytes = 0;           // Q values staging
  int64_t k_bytes = 0;           // K input staging (WriteEntries)
  int64_t out_ints = 0;          // top-k output staging
  int64_t cand = 0;              // top-k candidates (keys + positions)
  int64_t arena_bytes = 0;
  int64_t host_in_bytes = 0;     // pinned upload staging
  int64_t host_out_bytes = 0;    // pinned download staging
};

// A pinned host buffer handed out front to back within one call (or one
// step's metadata copy) and reset at the next.
struct HostStage {
  uint8_t* base = nullptr;
  int64_t bytes = 0;
  int64_t used = 0;
  // `n` bytes, 64-byte aligned, or null when they do not fit.
  uint8_t* Take(int64_t n) {
    const int64_t at = (used + 63) / 64 * 64;
    if (base == nullptr || n > bytes - at) return nullptr;
    used = at + n;
    return base + at;
  }
};

class GpuBackend : public Backend {
 public:
  static absl::StatusOr<std::unique_ptr<GpuBackend>> Create(int ordinal);
  ~GpuBackend() override;
  GpuBackend(const GpuBackend&) = delete;
  GpuBackend& operator=(const GpuBackend&) = delete;

  std::string Describe() const override;
  std::string Kind() const override { return "gpu"; }
  absl::StatusOr<int64_t> FreeDeviceMemory() const override;

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
  // The candidate and block paths compose the dense logits and top-k kernels
  // with the kernels of paths_kernels.cu. Consumers always take the masked
  // form on the gpu (dense logits, then the pool's slots compacted in place
  // before the top-k); `mode` only selects among identical results.
  Paths SupportedPaths() const override { return {true, true}; }
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
                                         StepContext* ctx, const BlockQInput& q,
                                         const BlockSpec& spec,
                                         int32_t* out) override;
  absl::StatusOr<LayerTimings> RunLayer(PoolHandle pool, StepContext* ctx,
                                        const LayerWork& work) override;
  absl::Status CopyDeviceToHost(void* dst, const void* device_src, int64_t bytes) override;
  absl::Status ReadEntries(const PageLayout& layout, PoolHandle pool,
                           int32_t page, int32_t first, int32_t count,
                           uint8_t* out) override;
  // Device regions (device_regions.cc).
  absl::StatusOr<OpenedDeviceRegion> OpenDeviceRegion(const std::string& ipc_handle,
                                                      const std::string& device_uuid,
                                                      const std::string& pci_bus_id,
                                                      uint64_t offset,
                                                      uint64_t bytes) override;
  absl::Status CloseDeviceRegion(void* base) override;
  // Pinned buffers (HostMalloc), freed with the backend; Upload / Download
  // copy to and from a lent one directly instead of through host_in_ /
  // host_out_.
  HostBufferPool& host_buffers() override { return *pinned_; }

  // For tests and the benchmark.
  int num_sms() const { return props_.multiProcessorCount; }
  const DeviceProp& props() const { return props_; }
  // The backend's stream: the benchmark enqueues its L2 flush there, so the
  // backend's events see the flush complete before they are stamped (a
  // flush on another stream overlaps them).
  Stream stream_for_bench() const ABSL_NO_THREAD_SAFETY_ANALYSIS { return stream_; }
  // "wgmma_mxfp4", "wgmma_ws", "wgmma", "mma" or "portable": the logits
  // kernel of the last dense walk (DenseTopk, candidate layers); kernels
  // joined by '+' in order of first use when its sub-chunks took several.
  std::string last_logits_path() const;
  // Caps the logits path: 0 portable, 1 mma.sync, 2 wgmma (default); tests
  // compare the paths.
  void set_max_logits_path(int v);
  // wgmma_ws's claimed tail (plan.h: TailRule; LogitsParams::claims) for
  // later calls (default DefaultWsTail(): the knob's, else 20 % where groups
  // have two or more rows and every block keeps 24 units); tests run it on
  // every launch.
  void set_ws_tail(TailRule rule);
  // Timing of a layer's logits and its top-k. Split (true): an event
  // between the two kernels, each timed alone (LayerTimings::logits_us and
  // topk_us); that event holds the top-k's launch ~3 us (H100, s26). Joint
  // (false, the default; INDEXER_GPU_SPLIT_TIMING=1 makes split the
  // default): one span from the logits kernel's start over every kernel
  // after it up to the layer's first copy (the top-k; a masked consumer's
  // compaction before it), reported as logits_us ("includes top-k where fused",
  // indexer.proto); topk_us keeps the spans after that copy (a source's
  // pool selection). The benchmark times both.
  void set_split_timing(bool split);
  // The bench's kernel timeline (params.h: TraceWord): later logits and
  // block-score launches write one record a block into `records` (device
  // memory, the caller's; zeroed by the caller before each call), blocks
  // past `blocks` none. Null: off (the default).
  void set_bench_trace(uint64_t* records, int32_t blocks);

 private:
  struct Pool {
    uint8_t* data;
    int64_t num_pages;
    int64_t page_bytes;
    bool has_tmap;      // FP8 linear pages on sm_90: K through the TMA
    TensorMap tmap;
    // The same pool in boxes of 8 entries (the consumer's gather walk:
    // gather_logits.h); false where has_tmap is.
    bool has_rows8 = false;
    TensorMap rows8{};
    // Block layers' pages (linear MXFP4) on sm_90: one page's values a box,
    // 64-byte swizzle (BlockScoreParams::tmap).
    bool has_block_tmap = false;
    TensorMap block_tmap{};
  };
  class Step;
  // A download through the pinned staging, copied out after the sync.
  struct PendingCopy {
    void* dst;
    const void* src;
    size_t bytes;
  };
  // A timed span: elapsed time of events [first, last] added to *sum.
  struct PendingSpan {
    int first, last;
    double* sum;
  };
  static constexpr int kEvents = 64;

  // A call's hold on the stream: mu_, BeginCall, and on an early return a
  // wait for the stream (nothing may still use the staging or the caller's
  // buffers); nothing at all when nested in RunLayer's call, which holds it.
  class CallScope {
   public:
    CallScope(GpuBackend* b, bool nested) : b_(b), nested_(nested) {}
    CallScope(const CallScope&) = delete;
    CallScope& operator=(const CallScope&) = delete;
    ~CallScope() ABSL_NO_THREAD_SAFETY_ANALYSIS {
      if (begun_ && !ended_) (void)StreamSynchronize(b_->stream_);
      if (locked_) b_->mu_.Unlock();
    }
    absl::Status Begin() ABSL_NO_THREAD_SAFETY_ANALYSIS {
      if (nested_) return absl::OkStatus();
      b_->mu_.Lock();
      locked_ = true;
      begun_ = true;
      return b_->BeginCall();
    }
    absl::Status End() ABSL_NO_THREAD_SAFETY_ANALYSIS {
      if (nested_) return absl::OkStatus();
      absl::Status s = b_->EndCall();
      ended_ = s.ok();
      return s;
    }

   private:
    GpuBackend* const b_;
    const bool nested_;
    bool locked_ = false, begun_ = false, ended_ = false;
  };

  // The bodies of the public calls; `nested`: inside RunLayer's call (mu_
  // held, call begun, the end and its wait are RunLayer's). Timings are
  // added to *us / *timings at the call's wait.
  absl::Status WriteImpl(const PageLayout& layout, PoolHandle pool, const StepRows& rows,
                         StepContext* ctx, const KInput& k, double* us, bool nested)
      ABSL_NO_THREAD_SAFETY_ANALYSIS;
  absl::Status DenseImpl(const PageLayout& layout, PoolHandle pool, const StepRows& rows,
                         StepContext* ctx, const QInput& q, int32_t topk, int32_t* out,
                         LayerTimings* timings, bool nested) ABSL_NO_THREAD_SAFETY_ANALYSIS;
  absl::Status SourceImpl(const PageLayout& layout, PoolHandle pool, const StepRows& rows,
                          StepContext* ctx, const QInput& q, int32_t topk,
                          const CandidateSpec& spec, int32_t* out, LayerTimings* timings,
                          bool nested) ABSL_NO_THREAD_SAFETY_ANALYSIS;
  absl::Status ConsumerImpl(const PageLayout& layout, PoolHandle pool,
                            const StepRows& rows, StepContext* ctx, const QInput& q,
                            int32_t topk, const CandidateSpec& spec, ConsumerMode mode,
                            int32_t* out, LayerTimings* timings, bool nested)
      ABSL_NO_THREAD_SAFETY_ANALYSIS;
  absl::Status BlockImpl(const PageLayout& layout, PoolHandle pool, const StepRows& rows,
                         StepContext* ctx, const BlockQInput& q, const BlockSpec& spec,
                         int32_t* out, LayerTimings* timings, bool nested)
      ABSL_NO_THREAD_SAFETY_ANALYSIS;
  // Marks the call's checks armed (device inputs present) and clears the
  // verdict words on the host (no device work).
  absl::Status ArmChecks() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Output rows from out_ to the caller: a download, or a device copy when
  // the call's output is device memory (out_device_).
  absl::Status Emit(int32_t* dst, const int32_t* src, int64_t bytes)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);

  GpuBackend(int ordinal, const DeviceProp& props);
  absl::Status Init();
  absl::StatusOr<Pool> FindPool(PoolHandle handle,
                                const PageLayout& layout) const;
  // Validates and uploads the rows; the Step keeps them (single-layer
  // calls pass a copy, PrepareStep moves its own in).
  absl::StatusOr<std::unique_ptr<Step>> MakeStep(const PageLayout& layout, StepRows rows);
  // The step of `ctx`, checked to be this backend's for `rows`, its pages in
  // `pool`; null for a null ctx, after validating `rows` against `pool`.
  absl::StatusOr<Step*> CheckedStep(const PageLayout& layout,
                                    const StepRows& rows, StepContext* ctx,
                                    const Pool& pool);

  // Per-call stream helpers. REQUIRES: mu_ held; BeginCall first.
  absl::Status BeginCall() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Enqueues host `src` -> device `dst`, through the pinned staging when it
  // has room; the caller's `src` is read by the call's end.
  absl::Status Upload(void* dst, const void* src, int64_t bytes)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Enqueues device `src` -> host `dst`; `dst` is written by EndCall.
  absl::Status Download(void* dst, const void* src, int64_t bytes)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // A timed span. When the caller set chain_next_span_ and nothing was
  // enqueued since the last span's end (no copy, no check), the span starts
  // at that end's event instead of recording its own: adjacent spans share
  // their boundary (a dense layer records 4 events, not 6).
  absl::Status BeginSpan() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  absl::Status EndSpan(double* sum) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // The logits kernel's span: ended here when split_timing_, else left
  // open (no event): BeginSpan and EndSpan are then no-ops, and
  // CloseOpenSpan (at the next copy, the wait, or the sub-chunk's end)
  // records its end and adds the whole to `sum`.
  absl::Status EndLogitsSpan(double* sum) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  absl::Status CloseOpenSpan() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // The device inputs' value checks (k entries or floats; weights, Q codes,
  // Q scales) in one launch, once per call: arms the verdict, enqueues them.
  absl::Status LaunchDeviceChecks(const PageLayout& layout, const StepRows& rows,
                                  const KInput* k, const QInput* q)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // DenseTopk's argument checks (shared with the candidate layers).
  absl::Status CheckDenseArgs(const PageLayout& layout, const QInput& q,
                              int32_t topk, int32_t num_rows,
                              const int32_t* out) const;
  // INVALID_ARGUMENT unless Q's values, weights (and MXFP4 scales) are set.
  static absl::Status CheckQTensors(const PageLayout& layout, const QInput& q);
  // CheckedStep for the candidate layers, which need the step's context.
  absl::StatusOr<Step*> CandidateStep(const PageLayout& layout,
                                      const StepRows& rows, StepContext* ctx,
                                      const Pool& pool);
  // A consumer's gather walk: the pool's slots scored instead of the rows'
  // entries (LogitsParams::gather_*), through these groups and units (one
  // row each; `ranges` per sub-chunk of the step's plan).
  struct GatherWalk {
    const LogitsGroup* groups;
    const LogitsUnit* units;
    const std::vector<std::pair<int32_t, int32_t>>* ranges;
    const int32_t* blocks;   // the pool: [rows, stride] block ids
    const int32_t* entries;  // [rows] its entries below n_r
    int32_t stride;
    int32_t block;
  };
  // The dense walk of DenseTopk and the candidate layers: per sub-chunk of
  // the step's plan, uploads the sub-chunk's Q, enqueues its logits into
  // logits_ (only the pool's, at their slots, with `gather`), then `after`
  // enqueues the rest of the sub-chunk's work.
  absl::Status DenseWalk(const Pool& p, const PageLayout& layout,
                         const uint8_t* pool, Step* step, const QInput& q,
                         LayerTimings* timings,
                         absl::FunctionRef<absl::Status(const SubChunk&)> after,
                         const GatherWalk* gather = nullptr, int32_t fuse_topk = 0)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // fuse_topk > 0 (DenseWalk): the top-k of that k follows each sub-chunk's
  // logits; where it will run cooperatively in one piece and the logits
  // kernel can, the kernel builds its first histogram (topk_hist_ready_
  // true during `after`: TopkPieces' hist_ready).
  bool TopkWantsHist(int64_t rows, int32_t max_visible, int32_t topk) const;
  // Top-k of `rows` rows of `logits` (row lengths on the device) in pieces
  // that fit out_; after each piece's kernels `piece_done(first, count)`
  // enqueues what reads out_ ([count, topk]). With `direct_out` (device
  // memory of [rows, topk]) the pieces are written there instead of out_.
  // With `pool` (a candidate consumer's rows: positions are pool slots) the
  // entries the slots hold are written (TopkParams::pool_blocks).
  struct PoolMap {
    const int32_t* blocks;  // [rows, topk_blocks] ascending block ids
    int32_t topk_blocks;
    int32_t block_size;
  };
  absl::Status TopkPieces(const float* logits, int64_t stride,
                          const int32_t* row_visible, int64_t rows,
                          int32_t max_visible, int32_t topk, double* us,
                          absl::FunctionRef<absl::Status(int64_t, int64_t)> piece_done,
                          int32_t* direct_out = nullptr, bool hist_ready = false,
                          const PoolMap* pool = nullptr)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Waits for the stream, adds the spans' times, fills the downloads.
  absl::Status Sync() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  absl::Status EndCall() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);

  const int ordinal_;
  const DeviceProp props_;
  Workspace ws_;
  std::unique_ptr<DeviceArena> arena_;

  mutable absl::Mutex mu_;
  Stream stream_ ABSL_GUARDED_BY(mu_) = nullptr;
  Event ev_[kEvents] ABSL_GUARDED_BY(mu_) = {};
  int ev_used_ ABSL_GUARDED_BY(mu_) = 0;
  int span_begin_ ABSL_GUARDED_BY(mu_) = 0;  // the open span's first event
  // The last span's end event while nothing was enqueued after it, else -1.
  int chain_edge_ ABSL_GUARDED_BY(mu_) = -1;
  bool chain_next_span_ ABSL_GUARDED_BY(mu_) = false;
  bool split_timing_ ABSL_GUARDED_BY(mu_) = false;  // set_split_timing
  uint64_t* trace_ ABSL_GUARDED_BY(mu_) = nullptr;  // set_bench_trace
  int32_t trace_blocks_ ABSL_GUARDED_BY(mu_) = 0;
  // EndLogitsSpan left the span open; its time goes to *open_sum_.
  bool span_open_ ABSL_GUARDED_BY(mu_) = false;
  double* open_sum_ ABSL_GUARDED_BY(mu_) = nullptr;
  bool checks_launched_ ABSL_GUARDED_BY(mu_) = false;  // this call's, by RunLayer
  std::vector<PendingSpan> spans_ ABSL_GUARDED_BY(mu_);
  std::unique_ptr<HostBufferPool> pinned_;  // made in the constructor
  HostStage host_in_ ABSL_GUARDED_BY(mu_);
  HostStage host_out_ ABSL_GUARDED_BY(mu_);
  std::vector<PendingCopy> downloads_ ABSL_GUARDED_BY(mu_);
  // Recorded after a step's metadata upload from host_in_, which PrepareStep
  // does not wait for: the next call waits for it before reusing host_in_.
  Event staged_ ABSL_GUARDED_BY(mu_) = nullptr;
  bool staged_pending_ ABSL_GUARDED_BY(mu_) = false;
  std::vector<void*> allocations_ ABSL_GUARDED_BY(mu_);
  // Read on every call; written at start-up only.
  mutable absl::Mutex pools_mu_;
  std::vector<Pool> pools_ ABSL_GUARDED_BY(pools_mu_);
  uint8_t* arena_base_ = nullptr;
  float* logits_ = nullptr;
  uint8_t* q_values_ = nullptr;
  uint8_t* q_scales_ = nullptr;
  float* q_weights_ = nullptr;
  uint8_t* k_stage_ = nullptr;
  int32_t* out_ = nullptr;
  uint32_t* cand_keys_ = nullptr;
  int32_t* cand_pos_ = nullptr;
  uint32_t* topk_state_ = nullptr;
  // Per-call row scratch of the candidate and block paths: [max_rows x 64]
  // int32 (block counts, slot counts, causal pages per head and row).
  int32_t* aux_ = nullptr;
  // The ws logits kernel's claim counters (LogitsParams::claims), 0 between
  // launches.
  int32_t* ws_claims_ = nullptr;
  // The device checks' state (CheckParams::state: [kCheckSlots + 1] words).
  uint32_t* check_state_ = nullptr;
  // Their verdict: first bad element of the call's device inputs (k,
  // weights, q FP8 codes, q_scale e8m0; 0xffffffff = none), in mapped pinned
  // memory the check launch writes (verdict_dev_ its device address).
  uint32_t* verdict_host_ ABSL_GUARDED_BY(mu_) = nullptr;
  uint32_t* verdict_dev_ = nullptr;
  Fp8Variant q_check_fp8_ ABSL_GUARDED_BY(mu_) = Fp8Variant::kE4m3fn;  // q's NaN rule
  bool checks_armed_ ABSL_GUARDED_BY(mu_) = false;
  bool out_device_ ABSL_GUARDED_BY(mu_) = false;
  std::string last_path_ ABSL_GUARDED_BY(mu_);
  bool topk_hist_ready_ ABSL_GUARDED_BY(mu_) = false;
  int max_path_ ABSL_GUARDED_BY(mu_) = 2;
  TailRule ws_tail_ ABSL_GUARDED_BY(mu_) = DefaultWsTail();
};

}  // namespace gpu
}  // namespace indexer

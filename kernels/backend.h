// The interface the server calls to store K entries and run indexer layers.
// Implementations: kernels/cpu (reference, embedded default) and kernels/gpu
// (CUDA / HIP). Nothing here knows about gRPC or the server's types.
//
// Memory: a backend owns every K pool it hands out (host memory for cpu,
// device memory for gpu); pools live until the backend is destroyed. All
// other pointers in this file are owned by the caller and only used during
// the call; they are host pointers unless an `on_device` flag says the bytes
// live in the gpu backend's device memory (device regions). The cpu backend
// refuses device pointers with FAILED_PRECONDITION.
//
// Thread safety: AllocatePool is called at start only. The other calls may
// run concurrently from different steps; a step touches only pages of its
// own sequences, so concurrent calls never write the same bytes.
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/base/call_once.h"
#include "absl/strings/str_cat.h"
#include "kernels/format/page_layout.h"
#include "kernels/geometry/step_geometry.h"
#include "kernels/host_buffers.h"

namespace indexer {

// A K pool as AllocatePool hands it out: a handle to memory the backend
// owns (host memory for cpu, device memory for gpu) until it is destroyed.
// Calls find the pool from the handle in O(1) (no search, no re-proof); a
// handle of another backend or a stale one is INVALID_ARGUMENT. `base` is
// the pool's first byte and `layout` its page layout, for tests, the bench
// and ReadEntries-style checks; the server passes the handle around only.
struct PoolHandle {
  const void* owner = nullptr;  // the backend that allocated it
  int32_t index = -1;           // its number among the owner's pools
  uint8_t* base = nullptr;
  int64_t num_pages = 0;
  PageLayout layout;
};

// A backend's own per-step state (device copies of StepRows, the decode work
// schedule). Created by PrepareStep, destroyed when the step ends.
class StepContext {
 public:
  explicit StepContext(StepRows rows) : rows_(std::move(rows)) {}
  virtual ~StepContext() = default;
  // The step's rows, built once per step and group, validated and (gpu)
  // uploaded by PrepareStep; RunLayer reads them from here.
  const StepRows& rows() const { return rows_; }
  // Where the backend's PrepareStep spent its time, for the daemon's debug
  // log of each step header ("" when the backend does not say).
  virtual std::string PrepareParts() const { return {}; }

 private:
  const StepRows rows_;
};

// New K entries of one layer for one step: row i is entry
// seq_old_entries[s] + (i - seq_k_begin[s]) of sequence s.
struct KInput {
  enum class Kind { kFloat32, kBf16, kQuantized };
  Kind kind = Kind::kFloat32;
  // kFloat32: [n, D] float; kBf16: [n, D] uint16 bf16 bits;
  // kQuantized: [n, VB + SB] entries in linear form (values then scales).
  const void* data = nullptr;
  bool ue8m0 = true;  // FP8 scale rule for kFloat32 / kBf16 (SPEC §3)
  // `data` is device memory. Its finiteness (and, for kQuantized, its e4m3
  // NaN codes and scales) is then checked on the device, not by the caller:
  // a bad tensor fails the call with INVALID_ARGUMENT naming "k" after the
  // entries were written (past the step's committed lengths).
  bool on_device = false;
};

// Index queries and head weights of one layer, quantized to the K format.
struct QInput {
  int32_t num_heads = 0;     // H
  const uint8_t* values = nullptr;  // [rows, H, VB] e4m3 codes or packed e2m1
  const uint8_t* scales = nullptr;  // [rows, H, D/32] e8m0 (MXFP4), else null
  const float* weights = nullptr;   // [rows, H] fp32, Q scales folded in
  // values, scales and weights are device memory; weights are then checked
  // finite on the device (INVALID_ARGUMENT naming "weights").
  bool on_device = false;
};

// The two-level candidate path (SPEC §5). One source layer per set and step
// builds each row's pool of candidate blocks; the set's consumers score only
// their row's pool.
struct CandidateSpec {
  int32_t set = 0;            // which candidate set of the step (0-based)
  int32_t block_size = 8;     // candidate_block_size, entries per block
  int32_t topk_blocks = 2048; // candidate_topk_blocks, pool size per row
  bool pin_newest = true;     // the row's newest block is always in its pool
  // Length gate for ConsumerMode::kAuto: consumers gather the pool when the
  // step's widest row sees more than gate_ratio x pool entries, else mask a
  // dense walk. Results never depend on the choice.
  int32_t gate_ratio = 1;
};

enum class ConsumerMode { kAuto, kGather, kMasked };

// The MiniMax-M3 block path (SPEC §5): blocks are pages.
struct BlockSpec {
  int32_t topk_blocks = 16;
  int32_t init_blocks = 0;    // first blocks forced in (sentinel 1e30)
  int32_t local_blocks = 1;   // last causal blocks forced in (sentinel 1e29)
  float scale = 0.0883883476f;  // D^-0.5
};

struct BlockQInput {
  int32_t num_heads = 0;       // Hi
  const float* q = nullptr;    // [rows, Hi, D] fp32 (bf16 / e4m3 widened)
};

struct LayerTimings {
  double write_us = 0;
  double logits_us = 0;
  double topk_us = 0;
  // Host time of RunLayer on a device backend: issuing the work, and the
  // wait for it (0 where the backend computes on the calling thread).
  double enqueue_us = 0;
  double wait_us = 0;
};

// What one layer of a step does, for Backend::RunLayer: write the step's new
// entries (k; absent when the step has none), then score and select by role.
enum class LayerKind { kDense, kCandidateSource, kCandidateConsumer, kBlock };

struct LayerWork {
  LayerKind kind = LayerKind::kDense;
  // New entries; null when the step writes none (rows.NewEntries() == 0).
  const KInput* k = nullptr;
  QInput q;              // dense and candidate kinds
  BlockQInput block_q;   // kBlock (host memory)
  int32_t topk = 0;      // dense and candidate kinds
  CandidateSpec candidate;
  ConsumerMode mode = ConsumerMode::kAuto;
  BlockSpec block;
  // [num_rows, topk] or, for kBlock, [Hi, num_rows, topk_blocks] int32.
  int32_t* out = nullptr;
  bool out_on_device = false;  // `out` is device memory (no download)
};

class Backend {
 public:
  virtual ~Backend() = default;

  // One line for logs and ServerInfo: "cpu (8 threads)", "cuda:0 NVIDIA H200".
  virtual std::string Describe() const = 0;
  // "cpu" or "gpu".
  virtual std::string Kind() const = 0;
  // Bytes of device memory free for K pools now, checked against the cache
  // size at start. NOT_FOUND when the backend cannot tell (the cpu backend:
  // the daemon reads the host's MemAvailable).
  virtual absl::StatusOr<int64_t> FreeDeviceMemory() const {
    return absl::NotFoundError("device memory: not reported by the " + Kind() + " backend");
  }

  // Paths beyond the dense one that this backend implements; the daemon
  // refuses at start a profile that needs one it lacks.
  struct Paths {
    bool candidate = false;  // CandidateSource / CandidateConsumer
    bool block = false;      // BlockTopk
  };
  virtual Paths SupportedPaths() const { return {}; }

  // Reserves a zeroed pool of `num_pages` pages of `layout`. Start-up only.
  virtual absl::StatusOr<PoolHandle> AllocatePool(const PageLayout& layout,
                                                  int64_t num_pages) = 0;

  // Per-step state shared by all layers of a group in this step.
  virtual absl::StatusOr<std::unique_ptr<StepContext>> PrepareStep(
      const PageLayout& layout, StepRows rows) = 0;

  // Writes the step's new entries of one layer into `pool` through the block
  // table. REQUIRES: inputs validated (shape, finiteness) by the caller.
  virtual absl::StatusOr<double> WriteEntries(const PageLayout& layout,
                                              PoolHandle pool,
                                              const StepRows& rows,
                                              StepContext* ctx,
                                              const KInput& k) = 0;

  // Dense token path (SPEC §5): out[r, :] = positions of the topk largest
  // logits of row r over [0, row_visible[r]), -1 past them.
  // out: [num_rows, topk] int32, host memory.
  virtual absl::StatusOr<LayerTimings> DenseTopk(const PageLayout& layout,
                                                 PoolHandle pool,
                                                 const StepRows& rows,
                                                 StepContext* ctx,
                                                 const QInput& q, int32_t topk,
                                                 int32_t* out) = 0;

  // Candidate source: DenseTopk's output, and from the same logits each
  // row's pool (the topk_blocks candidate blocks with the largest maxima over
  // visible entries, the newest block pinned; all blocks when fewer), kept
  // in `ctx` under spec.set until the step ends.
  virtual absl::StatusOr<LayerTimings> CandidateSource(
      const PageLayout& layout, PoolHandle pool, const StepRows& rows,
      StepContext* ctx, const QInput& q, int32_t topk,
      const CandidateSpec& spec, int32_t* out) {
    return Unimplemented("candidate source layers");
  }

  // Candidate consumer: the topk largest logits among the visible entries of
  // the row's pool, as entry positions, -1 past them. Same set as dense
  // logits masked to -inf outside the pool. FAILED_PRECONDITION when the
  // set's source has not run in this step.
  virtual absl::StatusOr<LayerTimings> CandidateConsumer(
      const PageLayout& layout, PoolHandle pool, const StepRows& rows,
      StepContext* ctx, const QInput& q, int32_t topk,
      const CandidateSpec& spec, ConsumerMode mode, int32_t* out) {
    return Unimplemented("candidate consumer layers");
  }

  // Block path: out[h, r, :] = ids of the topk_blocks blocks with the largest
  // score[h, r, b] = max over visible e in b of scale * (q[r, h] . k[e]),
  // init / local blocks forced by sentinels, -1 past the row's causal blocks.
  // out: [Hi, num_rows, topk_blocks] int32.
  virtual absl::StatusOr<LayerTimings> BlockTopk(
      const PageLayout& layout, PoolHandle pool, const StepRows& rows,
      StepContext* ctx, const BlockQInput& q, const BlockSpec& spec,
      int32_t* out) {
    return Unimplemented("block layers");
  }

  // One layer: writes work.k's entries through the block table, then runs
  // the role's path (DenseTopk, CandidateSource, CandidateConsumer or
  // BlockTopk semantics) into work.out. The gpu backend enqueues the uploads,
  // the write kernel, the logits, the top-k and the download on its stream
  // and synchronizes once; this default composes the calls above (the cpu
  // backend's form) and refuses device tensors. On error after the write the
  // entries may be in the pool: callers keep them past committed lengths.
  // The layout is the pool's, the rows the context's (REQUIRES: ctx from
  // this backend's PrepareStep with that layout).
  virtual absl::StatusOr<LayerTimings> RunLayer(PoolHandle pool, StepContext* ctx,
                                                const LayerWork& work);

  // Host buffers this backend lends (host_buffers.h): the daemon stages
  // inline tensors and receives top-k in them. Pinned on the gpu backend,
  // whose uploads and downloads then copy to or from them directly (no
  // staging copy); plain heap memory here, the default. Lives as long as
  // the backend.
  virtual HostBufferPool& host_buffers();
  // Copies `bytes` bytes of device memory to the host (device inputs that
  // need host work, e.g. FP32 Q the daemon quantizes). FAILED_PRECONDITION
  // on a backend without device memory.
  virtual absl::Status CopyDeviceToHost(void* dst, const void* device_src, int64_t bytes) {
    return absl::FailedPreconditionError(absl::StrCat(
        "device tensors need the gpu backend; this daemon runs the ", Kind(), " backend"));
  }

  // Copies `count` entries starting at entry `first` of physical page `page`
  // into `out` ([count, VB + SB] linear form). For export and tests.
  virtual absl::Status ReadEntries(const PageLayout& layout,
                                   PoolHandle pool, int32_t page,
                                   int32_t first, int32_t count,
                                   uint8_t* out) = 0;

  // Device regions of the data plane (SPEC §6). Opens GPU memory another
  // process exported (`ipc_handle`: the bytes of a cudaIpcMemHandle /
  // hipIpcMemHandle) on the device named by `device_uuid` ("GPU-...") or,
  // when that is empty, `pci_bus_id`; that device must be the backend's own
  // or have peer access to it (peer access is enabled here). `base` is what
  // CloseDeviceRegion takes back; `data` = base + offset, `bytes` long.
  // The default (backends without a device): FAILED_PRECONDITION.
  struct OpenedDeviceRegion {
    void* base = nullptr;
    uint8_t* data = nullptr;
    std::string device;  // where it lives, for listings ("cuda:0 GPU-...")
  };
  virtual absl::StatusOr<OpenedDeviceRegion> OpenDeviceRegion(
      const std::string& ipc_handle, const std::string& device_uuid,
      const std::string& pci_bus_id, uint64_t offset, uint64_t bytes) {
    return absl::FailedPreconditionError(
        "device: device regions need the gpu backend; this daemon runs the " + Kind() +
        " backend");
  }
  // Closes what OpenDeviceRegion opened. REQUIRES: no work uses it any more.
  virtual absl::Status CloseDeviceRegion(void* base) {
    return absl::FailedPreconditionError("device regions need the gpu backend");
  }

 protected:
  absl::Status Unimplemented(const std::string& what) const {
    return absl::UnimplementedError(what + ": not implemented by the " + Kind() + " backend");
  }

 private:
  std::unique_ptr<HostBufferPool> heap_buffers_;  // host_buffers()' default, made on first use
  absl::once_flag heap_buffers_once_;
};

// The argument checks of Backend::ReadEntries, shared by the backends:
// INVALID_ARGUMENT naming the field unless page is in [0, num_pages), the
// entries [first, first + count) lie within a page and out is set.
inline absl::Status CheckReadEntriesArgs(const PageLayout& layout, int64_t num_pages,
                                  int32_t page, int32_t first, int32_t count,
                                  const uint8_t* out) {
  if (page < 0 || page >= num_pages) {
    return absl::InvalidArgumentError(
        absl::StrCat("page: expected a page in [0, ", num_pages, "), got ", page));
  }
  if (first < 0 || count < 0 || static_cast<int64_t>(first) + count > layout.page_entries) {
    return absl::InvalidArgumentError(absl::StrCat(
        "first + count: expected entries within [0, ", layout.page_entries,
        ") with first, count >= 0, got first ", first, ", count ", count));
  }
  if (count > 0 && out == nullptr) {
    return absl::InvalidArgumentError("out: expected a buffer, got null");
  }
  return absl::OkStatus();
}


// "auto" (gpu:0 when a GPU is present and built in, else cpu), "cpu",
// "gpu" or "gpu:N". `threads` 0 = all cores (cpu backend).
absl::StatusOr<std::unique_ptr<Backend>> MakeBackend(const std::string& device,
                                                     int threads = 0);

}  // namespace indexer

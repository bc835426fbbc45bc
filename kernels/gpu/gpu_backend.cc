#include "kernels/gpu/gpu_backend.h"

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdlib>
#include <cstring>
#include <map>
#include <vector>

#include "absl/cleanup/cleanup.h"
#include "absl/strings/str_cat.h"
#include "kernels/common/status_macros.h"
#include "kernels/geometry/step_geometry.h"  // ValidateStepRows: one set of rules
#include "kernels/gpu/gather_logits.h"
#include "kernels/gpu/gpu_backend_impl.h"
#include "kernels/gpu/gpu_step.h"
#include "kernels/gpu/knobs.h"

namespace indexer {
namespace gpu {
namespace {

absl::Status Bad(absl::string_view field, absl::string_view expected,
                 int64_t got) {
  return absl::InvalidArgumentError(
      absl::StrCat(field, ": expected ", expected, ", got ", got));
}

// Entries per work unit of the persistent FP8 wgmma kernel: the planner's
// rule for it (kWsUnits), or the INDEXER_GPU_WS_UNIT knob (knobs.h).
int32_t WsUnitEntries() {
  return Knobs().ws_unit_entries > 0 ? Knobs().ws_unit_entries : kWsUnits;
}

// Appends `v` to the int32 metadata image, 64-byte aligned; returns the
// word offset.
template <class T>
int64_t Append(std::vector<int32_t>& img, const T* v, size_t n) {
  static_assert(sizeof(T) % sizeof(int32_t) == 0, "int32 records only");
  while (img.size() % 16 != 0) img.push_back(0);
  const int64_t at = static_cast<int64_t>(img.size());
  const size_t words = n * sizeof(T) / sizeof(int32_t);
  img.resize(img.size() + words);
  if (words > 0) std::memcpy(img.data() + at, v, words * sizeof(int32_t));
  return at;
}

// The largest physical page any sequence of `rows` reaches (its pages for
// entries [0, seq_new_entries)), -1 when none. REQUIRES: rows validated.
int64_t MaxPage(const PageLayout& layout, const StepRows& rows) {
  int64_t max_page = -1;
  for (int32_t s = 0; s < rows.num_seqs; ++s) {
    const int64_t pages = PagesFor(rows.seq_new_entries[s], layout.page_entries);
    for (int64_t lp = 0; lp < pages; ++lp) {
      max_page = std::max<int64_t>(max_page, rows.Page(s, static_cast<int32_t>(lp)));
    }
  }
  return max_page;
}

// Waits for the stream when a call returns early, so that none of its
// copies still reads or writes the staging or the caller's buffers.
class DrainOnError {
 public:
  explicit DrainOnError(Stream s) : s_(s) {}
  ~DrainOnError() {
    if (s_ != nullptr) (void)StreamSynchronize(s_);
  }
  void Dismiss() { s_ = nullptr; }

 private:
  Stream s_;
};

}  // namespace

GpuBackend::GpuBackend(int ordinal, const DeviceProp& props)
    : ordinal_(ordinal), props_(props) {
  pinned_ = std::make_unique<HostBufferPool>(
      [ordinal](size_t n) -> void* {
        // Lend runs on the daemon's threads: allocate in this device's context.
        void* p = nullptr;
        if (SetDevice(ordinal) != kSuccess) return nullptr;
        return HostMalloc(&p, n) == kSuccess ? p : nullptr;
      },
      [](void* p) { (void)HostFree(p); }, /*pinned=*/true, HostBufferPool::Limits());
}

absl::StatusOr<std::unique_ptr<GpuBackend>> GpuBackend::Create(int ordinal) {
  int n = 0;
  GPU_RETURN_IF_ERROR(GetDeviceCount(&n));
  if (ordinal < 0 || ordinal >= n) {
    return absl::InvalidArgumentError(absl::StrCat(
        "device: expected gpu:N with N in [0, ", n, "), got gpu:", ordinal));
  }
  GPU_RETURN_IF_ERROR(SetDevice(ordinal));
  DeviceProp props;
  GPU_RETURN_IF_ERROR(GetDeviceProperties(&props, ordinal));
  std::unique_ptr<GpuBackend> b(new GpuBackend(ordinal, props));
  RETURN_IF_ERROR(b->Init());
  return b;
}

absl::Status GpuBackend::Init() {
  absl::MutexLock lock(&mu_);
  ws_.logits_floats = Knobs().logits_mb * (1 << 20) / 4;
  split_timing_ = Knobs().split_timing;
  ws_.q_bytes = static_cast<int64_t>(ws_.max_rows) * ws_.max_heads * 128;
  ws_.k_bytes = int64_t{256} << 20;
  ws_.out_ints = static_cast<int64_t>(ws_.max_rows) * 2048;
  ws_.cand = int64_t{32} << 20;
  ws_.arena_bytes = int64_t{256} << 20;
  // Decode steps of up to ~1k rows at H 64 (Q 8 KiB, top-k 8 KiB a row).
  ws_.host_in_bytes = int64_t{16} << 20;
  ws_.host_out_bytes = int64_t{16} << 20;
  GPU_RETURN_IF_ERROR(StreamCreate(&stream_));
  for (Event& e : ev_) GPU_RETURN_IF_ERROR(EventCreate(&e));
  GPU_RETURN_IF_ERROR(EventCreate(&staged_));
  spans_.reserve(kEvents / 2);
  for (HostStage* h : {&host_in_, &host_out_}) {
    const int64_t bytes = h == &host_in_ ? ws_.host_in_bytes : ws_.host_out_bytes;
    void* v = nullptr;
    GPU_RETURN_IF_ERROR(HostMalloc(&v, static_cast<size_t>(bytes)));
    h->base = static_cast<uint8_t*>(v);
    h->bytes = bytes;
  }
  auto take = [&](int64_t bytes, auto** p) -> absl::Status {
    void* v = nullptr;
    GPU_RETURN_IF_ERROR(Malloc(&v, static_cast<size_t>(bytes)));
    allocations_.push_back(v);
    *p = static_cast<std::remove_reference_t<decltype(*p)>>(v);
    return absl::OkStatus();
  };
  RETURN_IF_ERROR(take(ws_.logits_floats * 4, &logits_));
  RETURN_IF_ERROR(take(ws_.q_bytes, &q_values_));
  RETURN_IF_ERROR(take(ws_.q_bytes / 8, &q_scales_));
  RETURN_IF_ERROR(take(static_cast<int64_t>(ws_.max_rows) * ws_.max_heads * 4, &q_weights_));
  RETURN_IF_ERROR(take(ws_.k_bytes, &k_stage_));
  RETURN_IF_ERROR(take(ws_.out_ints * 4, &out_));
  RETURN_IF_ERROR(take(ws_.cand * 4, &cand_keys_));
  RETURN_IF_ERROR(take(ws_.cand * 4, &cand_pos_));
  RETURN_IF_ERROR(take(int64_t{ws_.max_rows} * kTopkStateWords * 4, &topk_state_));
  // The cooperative top-k leaves its state zeroed after every use.
  GPU_RETURN_IF_ERROR(MemsetAsync(topk_state_, 0, int64_t{ws_.max_rows} * kTopkStateWords * 4, stream_));
  GPU_RETURN_IF_ERROR(StreamSynchronize(stream_));
  RETURN_IF_ERROR(take(int64_t{ws_.max_rows} * 64 * 4, &aux_));
  RETURN_IF_ERROR(take(2 * 4, &ws_claims_));
  GPU_RETURN_IF_ERROR(MemsetAsync(ws_claims_, 0, 2 * 4, stream_));
  // The checks' state starts as every launch leaves it (CheckParams::state).
  RETURN_IF_ERROR(take((kCheckSlots + 1) * 4, &check_state_));
  GPU_RETURN_IF_ERROR(MemsetAsync(check_state_, 0xff, kCheckSlots * 4, stream_));
  GPU_RETURN_IF_ERROR(MemsetAsync(check_state_ + kCheckSlots, 0, 4, stream_));
  GPU_RETURN_IF_ERROR(StreamSynchronize(stream_));
  {
    void* host = nullptr;
    void* dev = nullptr;
    GPU_RETURN_IF_ERROR(HostMallocMapped(&host, &dev, kCheckSlots * 4));
    verdict_host_ = static_cast<uint32_t*>(host);
    verdict_dev_ = static_cast<uint32_t*>(dev);
  }
  RETURN_IF_ERROR(take(ws_.arena_bytes, &arena_base_));
  arena_ = std::make_unique<DeviceArena>(arena_base_, ws_.arena_bytes);
  return absl::OkStatus();
}

GpuBackend::~GpuBackend() {
  absl::MutexLock lock(&mu_);
  if (stream_ != nullptr) (void)StreamSynchronize(stream_);
  {
    absl::MutexLock pools_lock(&pools_mu_);
    for (Pool& p : pools_) (void)Free(p.data);
  }
  for (void* v : allocations_) (void)Free(v);
  for (HostStage* h : {&host_in_, &host_out_}) {
    if (h->base != nullptr) (void)HostFree(h->base);
  }
  if (verdict_host_ != nullptr) (void)HostFree(verdict_host_);
  pinned_->Shutdown();  // lent buffers are freed when given back
  for (Event e : ev_) {
    if (e != nullptr) (void)EventDestroy(e);
  }
  if (staged_ != nullptr) (void)EventDestroy(staged_);
  if (stream_ != nullptr) (void)StreamDestroy(stream_);
}

std::string GpuBackend::Describe() const {
  const std::string knobs = KnobsSet();
  return absl::StrCat(kRuntimeName, ":", ordinal_, " ", props_.name, " (",
                      props_.multiProcessorCount, " SMs, cc ", props_.major,
                      ".", props_.minor, ")", knobs.empty() ? "" : "; knobs set: ", knobs);
}

std::string GpuBackend::last_logits_path() const {
  absl::MutexLock lock(&mu_);
  return last_path_;
}

void GpuBackend::set_max_logits_path(int v) {
  absl::MutexLock lock(&mu_);
  max_path_ = v;
}

void GpuBackend::set_ws_tail(TailRule rule) {
  absl::MutexLock lock(&mu_);
  ws_tail_ = rule;
}

void GpuBackend::set_split_timing(bool split) {
  absl::MutexLock lock(&mu_);
  split_timing_ = split;
}

void GpuBackend::set_bench_trace(uint64_t* records, int32_t blocks) {
  absl::MutexLock lock(&mu_);
  trace_ = records;
  trace_blocks_ = records != nullptr ? blocks : 0;
}

absl::StatusOr<int64_t> GpuBackend::FreeDeviceMemory() const {
  size_t free = 0, total = 0;
  absl::MutexLock lock(&mu_);
  GPU_RETURN_IF_ERROR(SetDevice(ordinal_));
  GPU_RETURN_IF_ERROR(MemGetInfo(&free, &total));
  return static_cast<int64_t>(free);
}

absl::StatusOr<PoolHandle> GpuBackend::AllocatePool(const PageLayout& layout,
                                                  int64_t num_pages) {
  const int64_t page_bytes = layout.page_bytes();
  if (num_pages < 1) return Bad("num_pages", ">= 1", num_pages);
  if (page_bytes < 1 || num_pages > (int64_t{1} << 40) / page_bytes) {
    return Bad("num_pages", "a pool size that fits in 2^40 bytes", num_pages);
  }
  absl::MutexLock lock(&mu_);
  void* v = nullptr;
  const size_t bytes = static_cast<size_t>(num_pages * page_bytes);
  const Error err = Malloc(&v, bytes);
  if (err != kSuccess) {
    (void)GetLastError();
    return absl::ResourceExhaustedError(absl::StrCat(
        "pool: cannot allocate ", num_pages, " pages of ", page_bytes,
        " bytes on ", Describe(), " (", ErrorString(err), ")"));
  }
  Pool pool{static_cast<uint8_t*>(v), num_pages, page_bytes, false, {}};
  // Tensor maps see the pool as [pages, E, VB value bytes] (each page's
  // values, its scales left out).
  const uint64_t dims[3] = {static_cast<uint64_t>(layout.value_bytes()),
                            static_cast<uint64_t>(layout.page_entries),
                            static_cast<uint64_t>(num_pages)};
  const uint64_t strides[2] = {static_cast<uint64_t>(layout.value_bytes()),
                               static_cast<uint64_t>(page_bytes)};
  if (PoolWantsTensorMap(layout, props_.major)) {
    // FP8: a box is one 64-entry tile (128-byte rows, 128-byte swizzle).
    const uint32_t box[3] = {static_cast<uint32_t>(layout.value_bytes()), 64, 1};
    pool.has_tmap = EncodeTensorMapU8(&pool.tmap, v, dims, strides, box, 128).ok();
    // The consumer's gather walk copies 8-entry chunks of pool blocks.
    const uint32_t box8[3] = {static_cast<uint32_t>(layout.value_bytes()), 8, 1};
    pool.has_rows8 = pool.has_tmap && EncodeTensorMapU8(&pool.rows8, v, dims, strides, box8, 128).ok();
  }
  if (BlockPoolWantsTensorMap(layout, props_.major)) {
    // Block layers (MXFP4): a box is one page's values, 64-byte swizzle.
    const uint32_t box[3] = {static_cast<uint32_t>(layout.value_bytes()),
                             static_cast<uint32_t>(layout.page_entries), 1};
    pool.has_block_tmap = EncodeTensorMapU8(&pool.block_tmap, v, dims, strides, box, 64).ok();
  }
  int32_t index;
  {
    absl::MutexLock pools_lock(&pools_mu_);
    pools_.push_back(pool);
    index = static_cast<int32_t>(pools_.size() - 1);
  }
  GPU_RETURN_IF_ERROR(MemsetAsync(v, 0, bytes, stream_));
  GPU_RETURN_IF_ERROR(StreamSynchronize(stream_));
  return PoolHandle{this, index, static_cast<uint8_t*>(v), num_pages, layout};
}

absl::StatusOr<GpuBackend::Pool> GpuBackend::FindPool(
    PoolHandle handle, const PageLayout& layout) const {
  absl::ReaderMutexLock lock(&pools_mu_);
  // O(1): the handle names the pool; no search and no re-proof.
  if (handle.owner != this || handle.index < 0 ||
      handle.index >= static_cast<int32_t>(pools_.size()) ||
      pools_[handle.index].data != handle.base) {
    return absl::InvalidArgumentError("pool: expected a pool handle from this backend");
  }
  const Pool& p = pools_[handle.index];
  if (p.page_bytes != layout.page_bytes()) {
    return Bad("pool page bytes",
               absl::StrCat(layout.page_bytes(), " (", layout.DebugString(), ")"),
               p.page_bytes);
  }
  return p;
}

absl::StatusOr<std::unique_ptr<GpuBackend::Step>> GpuBackend::MakeStep(
    const PageLayout& layout, StepRows rows) {
  using Clock = std::chrono::steady_clock;
  const auto us = [](Clock::time_point a, Clock::time_point b) {
    return std::chrono::duration<double, std::micro>(b - a).count();
  };
  Step::Parts parts;
  auto t = Clock::now();
  const auto lap = [&](double* part) {
    const auto now = Clock::now();
    *part = us(t, now);
    t = now;
  };
  RETURN_IF_ERROR(ValidateStepRows(layout, rows, INT64_MAX));
  const int64_t max_page = MaxPage(layout, rows);
  lap(&parts.validate);
  const int32_t vb = std::max(layout.value_bytes(), 1);
  const PlanLimits limits{
      ws_.logits_floats,
      static_cast<int32_t>(std::min<int64_t>(ws_.max_rows, ws_.q_bytes / (int64_t{ws_.max_heads} * vb))),
      props_.multiProcessorCount,
      // FP8 on sm_90 runs the persistent wgmma kernel: fine units. The
      // MXFP4 one keeps the coarse units: with the fine ones (its producer
      // walks them 32 tiles at a time, hopper/tile_window.h) it measured no
      // faster at 32k and slower at 128k (H200, B=128 x 128k logits 749 ->
      // 794 us, V4.1 dense H 32 x 128k 343 -> 362; h200_2026-12-02_s11.md).
      layout.format == KvFormat::kFp8 && props_.major == 9 ? WsUnitEntries() : 0};
  ASSIGN_OR_RETURN(StepPlan plan, PlanStep(rows, limits));
  // Each unit's first physical page: the ws producer's first copy of a unit
  // then waits on the unit's load alone, not on a block-table load after it.
  for (LogitsUnit& u : plan.units) u.page0 = rows.Page(u.seq, LogicalPage(u.e_begin, layout.page_entries));
  lap(&parts.plan);

  std::vector<int32_t> img;
  // One allocation (each part padded to 16 words): growing by doubling
  // costs fresh-page faults in every step header at large batch.
  img.reserve(rows.block_table.size() + rows.seq_old_entries.size() + rows.seq_k_begin.size() +
              rows.row_visible.size() + rows.row_seq.size() +
              plan.groups.size() * sizeof(LogitsGroup) / 4 +
              plan.units.size() * sizeof(LogitsUnit) / 4 + 7 * 16);
  const int64_t o_bt = Append(img, rows.block_table.data(), rows.block_table.size());
  const int64_t o_old = Append(img, rows.seq_old_entries.data(), rows.seq_old_entries.size());
  const int64_t o_kb = Append(img, rows.seq_k_begin.data(), rows.seq_k_begin.size());
  const int64_t o_rv = Append(img, rows.row_visible.data(), rows.row_visible.size());
  const int64_t o_rs = Append(img, rows.row_seq.data(), rows.row_seq.size());
  const int64_t o_g = Append(img, plan.groups.data(), plan.groups.size());
  const int64_t o_u = Append(img, plan.units.data(), plan.units.size());
  const int64_t bytes = static_cast<int64_t>(img.size()) * 4;
  lap(&parts.image);
  ASSIGN_OR_RETURN(uint8_t* meta, arena_->Allocate(bytes, "step metadata"));
  lap(&parts.arena);
  auto step_or = [&]() -> absl::Status {
    absl::MutexLock lock(&mu_);
    RETURN_IF_ERROR(BeginCall());
    lap(&parts.wait);  // the lock and the previous staged copy
    DrainOnError drain(stream_);
    RETURN_IF_ERROR(Upload(meta, img.data(), bytes));
    if (host_in_.used == 0) {
      // Not staged: the copy reads `img`, which dies here.
      GPU_RETURN_IF_ERROR(StreamSynchronize(stream_));
    } else {
      // Staged: stream order puts the copy before every later kernel; the
      // next call waits for it only before reusing the staging.
      GPU_RETURN_IF_ERROR(EventRecord(staged_, stream_));
      staged_pending_ = true;
    }
    drain.Dismiss();
    return absl::OkStatus();
  }();
  if (!step_or.ok()) {
    arena_->Release(meta);
    return step_or;
  }
  const int32_t* w = reinterpret_cast<const int32_t*>(meta);
  DeviceStepRows dev{rows.num_seqs,
                     rows.num_rows,
                     rows.max_pages,
                     w + o_bt,
                     w + o_old,
                     w + o_kb,
                     w + o_rv,
                     reinterpret_cast<const LogitsGroup*>(w + o_g),
                     reinterpret_cast<const LogitsUnit*>(w + o_u),
                     w + o_rs};
  auto step =
      std::make_unique<Step>(arena_.get(), meta, std::move(plan), dev, std::move(rows), max_page);
  lap(&parts.upload);  // the staged copy's enqueue (and the Step's copy of the rows)
  parts.image_bytes = bytes;
  step->set_parts(parts);
  return step;
}

absl::StatusOr<std::unique_ptr<StepContext>> GpuBackend::PrepareStep(
    const PageLayout& layout, StepRows rows) {
  ASSIGN_OR_RETURN(std::unique_ptr<Step> s, MakeStep(layout, std::move(rows)));
  return std::unique_ptr<StepContext>(std::move(s));
}

absl::StatusOr<GpuBackend::Step*> GpuBackend::CheckedStep(
    const PageLayout& layout, const StepRows& rows, StepContext* ctx,
    const Pool& pool) {
  if (ctx == nullptr) {
    RETURN_IF_ERROR(ValidateStepRows(layout, rows, pool.num_pages));
    return nullptr;
  }
  Step* s = dynamic_cast<Step*>(ctx);
  if (s == nullptr || !s->Matches(rows)) {
    return absl::InvalidArgumentError(
        "ctx: expected the StepContext this gpu backend prepared for these rows");
  }
  RETURN_IF_ERROR(s->CheckPages(layout, rows, pool.num_pages));
  return s;
}

absl::Status GpuBackend::BeginCall() {
  // Calls come from any thread (the executor's, a request ring's worker),
  // and the runtime's current device is per thread: a daemon on gpu:N with
  // N != 0 would otherwise launch on device 0 with device N's stream.
  GPU_RETURN_IF_ERROR(SetDevice(ordinal_));
  if (staged_pending_) {
    GPU_RETURN_IF_ERROR(EventSynchronize(staged_));
    staged_pending_ = false;
  }
  // Every earlier call ended with the stream drained (EndCall or
  // DrainOnError): the staging is free.
  host_in_.used = 0;
  host_out_.used = 0;
  downloads_.clear();
  spans_.clear();
  ev_used_ = 0;
  chain_edge_ = -1;
  chain_next_span_ = false;
  span_open_ = false;
  checks_armed_ = false;
  checks_launched_ = false;
  out_device_ = false;
  return absl::OkStatus();
}

absl::Status GpuBackend::ArmChecks() {
  chain_edge_ = -1;  // the checks run between spans
  if (checks_armed_) return absl::OkStatus();
  // No bad element unless the launch's last block says otherwise (a launch
  // with nothing to check publishes nothing). A host store: the device
  // state needs no reset (the kernel leaves it clean), the verdict no copy.
  for (int s = 0; s < kCheckSlots; ++s) verdict_host_[s] = UINT32_MAX;
  checks_armed_ = true;
  return absl::OkStatus();
}

absl::Status GpuBackend::Emit(int32_t* dst, const int32_t* src, int64_t bytes) {
  RETURN_IF_ERROR(CloseOpenSpan());  // a copy or the wait ends a joint span first
  if (!out_device_) return Download(dst, src, bytes);
  chain_edge_ = -1;
  GPU_RETURN_IF_ERROR(CopyD2D(dst, src, static_cast<size_t>(bytes), stream_));
  return absl::OkStatus();
}

absl::Status GpuBackend::Upload(void* dst, const void* src, int64_t bytes) {
  RETURN_IF_ERROR(CloseOpenSpan());  // a copy or the wait ends a joint span first
  chain_edge_ = -1;
  // A lent pinned buffer (the daemon's inline tensors) is copied from as it
  // is; the caller keeps it until the call's end, like any source.
  if (pinned_->Contains(src, bytes)) {
    GPU_RETURN_IF_ERROR(CopyH2D(dst, src, static_cast<size_t>(bytes), stream_));
    return absl::OkStatus();
  }
  if (uint8_t* staged = host_in_.Take(bytes)) {
    std::memcpy(staged, src, static_cast<size_t>(bytes));
    src = staged;
  }
  GPU_RETURN_IF_ERROR(CopyH2D(dst, src, static_cast<size_t>(bytes), stream_));
  return absl::OkStatus();
}

absl::Status GpuBackend::Download(void* dst, const void* src, int64_t bytes) {
  RETURN_IF_ERROR(CloseOpenSpan());  // a copy or the wait ends a joint span first
  chain_edge_ = -1;
  // Into a lent pinned buffer (the reply's top-k) directly, or without
  // staging room, into the caller's memory.
  uint8_t* staged = pinned_->Contains(dst, bytes) ? nullptr : host_out_.Take(bytes);
  if (staged == nullptr) {
    GPU_RETURN_IF_ERROR(CopyD2H(dst, src, static_cast<size_t>(bytes), stream_));
    return absl::OkStatus();
  }
  GPU_RETURN_IF_ERROR(CopyD2H(staged, src, static_cast<size_t>(bytes), stream_));
  downloads_.push_back({dst, staged, static_cast<size_t>(bytes)});
  return absl::OkStatus();
}

absl::Status GpuBackend::BeginSpan() {
  if (span_open_) {  // continues the joint span (EndLogitsSpan)
    chain_next_span_ = false;
    return absl::OkStatus();
  }
  const bool chain = chain_next_span_ && chain_edge_ >= 0;
  chain_next_span_ = false;
  if (chain) {
    span_begin_ = chain_edge_;
    if (ev_used_ + 1 > kEvents) return absl::InternalError("span: no event left after a chained start");
    return absl::OkStatus();
  }
  if (ev_used_ + 2 > kEvents) RETURN_IF_ERROR(Sync());
  GPU_RETURN_IF_ERROR(EventRecord(ev_[ev_used_], stream_));
  span_begin_ = ev_used_++;
  return absl::OkStatus();
}

absl::Status GpuBackend::EndLogitsSpan(double* sum) {
  if (split_timing_) return EndSpan(sum);
  span_open_ = true;
  open_sum_ = sum;
  return absl::OkStatus();
}

absl::Status GpuBackend::CloseOpenSpan() {
  if (!span_open_) return absl::OkStatus();
  span_open_ = false;
  return EndSpan(open_sum_);
}

absl::Status GpuBackend::EndSpan(double* sum) {
  if (span_open_) return absl::OkStatus();  // the joint span runs on (CloseOpenSpan)
  GPU_RETURN_IF_ERROR(EventRecord(ev_[ev_used_], stream_));
  spans_.push_back({span_begin_, ev_used_, sum});
  chain_edge_ = ev_used_++;
  // A chained start needs one free event; keep two so either start fits.
  if (ev_used_ + 2 > kEvents) chain_edge_ = -1;
  return absl::OkStatus();
}

absl::Status GpuBackend::Sync() {
  RETURN_IF_ERROR(CloseOpenSpan());  // a copy or the wait ends a joint span first
  GPU_RETURN_IF_ERROR(StreamSynchronize(stream_));
  for (const PendingSpan& s : spans_) {
    float ms = 0.f;
    GPU_RETURN_IF_ERROR(EventElapsedMs(&ms, ev_[s.first], ev_[s.last]));
    *s.sum += ms * 1000.0;
  }
  spans_.clear();
  ev_used_ = 0;
  chain_edge_ = -1;
  return absl::OkStatus();
}

absl::Status GpuBackend::LaunchDeviceChecks(const PageLayout& layout, const StepRows& rows,
                                            const KInput* k, const QInput* q) {
  CheckParams cp{};
  cp.layout = layout;
  const int64_t n = rows.NewEntries();
  if (k != nullptr && k->on_device && n > 0) {
    // The host never sees device K: its values are checked here, on the
    // stream, and the verdict read after the call's one synchronization.
    CheckPart& part = cp.parts[cp.num_parts++];
    part.src = k->data;
    part.kind = k->kind == KInput::Kind::kFloat32 ? CheckKind::kFloat32
                : k->kind == KInput::Kind::kBf16  ? CheckKind::kBf16
                                                  : CheckKind::kQuantized;
    part.count = part.kind == CheckKind::kQuantized ? n : n * layout.head_dim;
    part.slot = 0;
  }
  if (q != nullptr && q->on_device && rows.num_rows > 0) {
    // Weights, Q's codes (FP8: the cache variant's NaN codes; e2m1 has
    // none) and Q's e8m0 scales (MXFP4).
    const int64_t rh = int64_t{rows.num_rows} * q->num_heads;
    if (cp.num_parts + 2 > kMaxCheckParts) return absl::InternalError("check: too many parts");
    cp.parts[cp.num_parts++] = {q->weights, rh, CheckKind::kFloat32, 1};
    if (layout.format == KvFormat::kMxfp4) {
      cp.parts[cp.num_parts++] = {q->scales, rh * (layout.head_dim / kMxBlock), CheckKind::kE8m0,
                                  3};
    } else {
      cp.parts[cp.num_parts++] = {q->values, rh * layout.value_bytes(), CheckKind::kFp8Codes,
                                  2};
      q_check_fp8_ = layout.fp8;
    }
  }
  if (cp.num_parts == 0) return absl::OkStatus();
  cp.state = check_state_;
  cp.verdict = verdict_dev_;
  RETURN_IF_ERROR(ArmChecks());
  RETURN_IF_ERROR(LaunchCheckInput(cp, stream_));
  return absl::OkStatus();
}

absl::Status GpuBackend::EndCall() {
  RETURN_IF_ERROR(Sync());
  for (const PendingCopy& c : downloads_) std::memcpy(c.dst, c.src, c.bytes);
  downloads_.clear();
  if (!checks_armed_) return absl::OkStatus();
  checks_armed_ = false;
  // The check launch's last block stored these (mapped memory; the wait
  // above is after it).
  uint32_t bad[kCheckSlots];
  for (int s = 0; s < kCheckSlots; ++s) bad[s] = static_cast<volatile uint32_t*>(verdict_host_)[s];
  if (bad[0] != UINT32_MAX) {
    return absl::InvalidArgumentError(absl::StrCat(
        "k: element ", bad[0],
        " of the device tensor is not finite (NaN or Inf, an e4m3 NaN code, a scale not "
        "finite > 0 or an e8m0 0xff); expected finite values"));
  }
  if (bad[1] != UINT32_MAX) {
    return absl::InvalidArgumentError(absl::StrCat(
        "weights: element ", bad[1],
        " of the device tensor is NaN or Inf; expected finite values"));
  }
  if (bad[2] != UINT32_MAX) {
    return absl::InvalidArgumentError(absl::StrCat(
        "q: byte ", bad[2], " of the device tensor is an ", Fp8VariantName(q_check_fp8_),
        " NaN code; expected finite codes"));
  }
  if (bad[3] != UINT32_MAX) {
    return absl::InvalidArgumentError(absl::StrCat(
        "q_scale: byte ", bad[3],
        " of the device tensor is 0xff (e8m0 NaN); expected 0x00..0xfe"));
  }
  return absl::OkStatus();
}

absl::StatusOr<double> GpuBackend::WriteEntries(const PageLayout& layout,
                                                PoolHandle pool_h,
                                                const StepRows& rows,
                                                StepContext* ctx,
                                                const KInput& k) {
  double us = 0;
  RETURN_IF_ERROR(WriteImpl(layout, pool_h, rows, ctx, k, &us, /*nested=*/false));
  return us;
}

absl::Status GpuBackend::WriteImpl(const PageLayout& layout, PoolHandle pool_h,
                                   const StepRows& rows, StepContext* ctx,
                                   const KInput& k, double* us, bool nested) {
  ASSIGN_OR_RETURN(const Pool p, FindPool(pool_h, layout));
  uint8_t* const pool = p.data;
  ASSIGN_OR_RETURN(Step * step, CheckedStep(layout, rows, ctx, p));
  const int64_t n = rows.NewEntries();
  if (n == 0) return absl::OkStatus();
  if (k.data == nullptr) return absl::InvalidArgumentError("k.data: expected a tensor, got null");
  std::unique_ptr<Step> owned;
  if (step == nullptr) {
    ASSIGN_OR_RETURN(owned, MakeStep(layout, rows));
    step = owned.get();
  }

  WriteParams wp{};
  wp.layout = layout;
  wp.pool = pool;
  wp.step = step->dev();
  wp.ue8m0 = k.ue8m0;
  int64_t row_bytes = 0;
  switch (k.kind) {
    case KInput::Kind::kFloat32: wp.source = KSource::kFloat32; row_bytes = 4 * layout.head_dim; break;
    case KInput::Kind::kBf16: wp.source = KSource::kBf16; row_bytes = 2 * layout.head_dim; break;
    case KInput::Kind::kQuantized: wp.source = KSource::kQuantized; row_bytes = layout.entry_bytes(); break;
  }
  const int64_t piece = std::max<int64_t>(1, ws_.k_bytes / row_bytes);
  CallScope call(this, nested);
  RETURN_IF_ERROR(call.Begin());
  if (!checks_launched_) RETURN_IF_ERROR(LaunchDeviceChecks(layout, rows, &k, nullptr));
  for (int64_t b = 0; b < n; b += piece) {
    // Pieces share k_stage_: stream order keeps each copy after the last
    // piece's kernel.
    const int64_t m = std::min(piece, n - b);
    const uint8_t* src = static_cast<const uint8_t*>(k.data) + b * row_bytes;
    if (k.on_device) {
      wp.src = src;  // read in place
    } else {
      RETURN_IF_ERROR(Upload(k_stage_, src, m * row_bytes));
      wp.src = k_stage_;
    }
    wp.entry_base = static_cast<int32_t>(b);
    wp.num_entries = static_cast<int32_t>(m);
    RETURN_IF_ERROR(BeginSpan());
    RETURN_IF_ERROR(LaunchWriteEntries(wp, stream_));
    RETURN_IF_ERROR(EndSpan(us));
  }
  return call.End();
}

absl::Status GpuBackend::DenseWalk(
    const Pool& p, const PageLayout& layout, const uint8_t* pool, Step* step,
    const QInput& q, LayerTimings* timings,
    absl::FunctionRef<absl::Status(const SubChunk&)> after, const GatherWalk* gather,
    int32_t fuse_topk) {
  const bool mx = layout.format == KvFormat::kMxfp4;
  const int64_t h = q.num_heads;
  const int64_t vb = layout.value_bytes(), nb = layout.head_dim / kMxBlock;
  if (!checks_launched_) RETURN_IF_ERROR(LaunchDeviceChecks(layout, step->rows(), nullptr, &q));
  // Every logits kernel this call ran, '+'-joined (sub-chunks may differ:
  // group rows pick the kernel), for tests that bound each kernel's error.
  std::string paths;
  // Sub-chunks share the Q, logits and output buffers on the device: stream
  // order keeps each writer after the last reader, so only the end waits.
  for (size_t ci = 0; ci < step->plan().chunks.size(); ++ci) {
    const SubChunk& sc = step->plan().chunks[ci];
    const int64_t rb = sc.row_begin, nr = sc.row_end - sc.row_begin;
    // ---- Q of the sub-chunk ---------------------------------------------
    // Device Q is read in place; host Q goes through the staging.
    const uint8_t* qv = q.values + rb * h * vb;
    const uint8_t* qs = mx ? q.scales + rb * h * nb : nullptr;
    const float* qw = q.weights + rb * h;
    if (!q.on_device) {
      RETURN_IF_ERROR(Upload(q_values_, qv, nr * h * vb));
      if (mx) RETURN_IF_ERROR(Upload(q_scales_, qs, nr * h * nb));
      RETURN_IF_ERROR(Upload(q_weights_, qw, nr * h * 4));
      qv = q_values_;
      qs = mx ? q_scales_ : nullptr;
      qw = q_weights_;
    }

    // ---- logits ------------------------------------------------------------
    LogitsParams lp{};
    lp.use_tma = p.has_tmap;
    lp.tmap = p.tmap;
    lp.layout = layout;
    lp.pool = pool;
    lp.step = step->dev();
    lp.unit_begin = sc.unit_begin;
    lp.unit_end = sc.unit_end;
    lp.row_base = sc.row_begin;
    lp.num_heads = q.num_heads;
    lp.max_group_rows = sc.max_group_rows;
    lp.num_sms = props_.multiProcessorCount;
    lp.q_values = qv;
    lp.q_scales = qs;
    lp.weights = qw;
    lp.logits = logits_;
    lp.stride = sc.stride;
    lp.l2_bytes = props_.l2CacheSize;
    lp.claims = ws_claims_;
    lp.tail = ws_tail_;
    lp.trace = trace_;
    lp.trace_blocks = trace_blocks_;
    if (fuse_topk > 0 && gather == nullptr && TopkWantsHist(nr, sc.max_visible, fuse_topk)) {
      lp.topk_hist = topk_state_;
      lp.topk_min_visible = fuse_topk;
    }
    const char* which = "portable";
    if (gather != nullptr) {
      // Only the pool's slots, one row a group (gather_logits.h picks the
      // kernel: whole 8-entry chunks by the copy engine where it can).
      lp.step.groups = gather->groups;
      lp.step.units = gather->units;
      lp.unit_begin = (*gather->ranges)[ci].first;
      lp.unit_end = (*gather->ranges)[ci].second;
      lp.max_group_rows = 1;
      lp.gather_blocks = gather->blocks;
      lp.gather_entries = gather->entries;
      lp.gather_stride = gather->stride;
      lp.gather_block = gather->block;
    }
    RETURN_IF_ERROR(BeginSpan());
    if (gather != nullptr) {
      RETURN_IF_ERROR(LaunchGatherLogits(lp, p.has_rows8 ? &p.rows8 : nullptr, props_.major, props_.minor,
                                         stream_, &which));
    } else {
      RETURN_IF_ERROR(LaunchDenseLogits(lp, props_.major, props_.minor, stream_, &which, max_path_));
    }
    if (("+" + paths + "+").find(std::string("+") + which + "+") == std::string::npos) {
      paths += (paths.empty() ? "" : "+") + std::string(which);
    }
    last_path_ = paths;
    topk_hist_ready_ = LogitsFillTopkHist(lp, which);
    RETURN_IF_ERROR(EndLogitsSpan(&timings->logits_us));
    absl::Status st = after(sc);
    topk_hist_ready_ = false;
    if (st.ok()) st = CloseOpenSpan();
    RETURN_IF_ERROR(st);
  }
  return absl::OkStatus();
}

absl::Status GpuBackend::TopkPieces(
    const float* logits, int64_t stride, const int32_t* row_visible,
    int64_t rows, int32_t max_visible, int32_t topk, double* us,
    absl::FunctionRef<absl::Status(int64_t, int64_t)> piece_done, int32_t* direct_out,
    bool hist_ready, const PoolMap* pool) {
  const int64_t piece = std::max<int64_t>(1, ws_.out_ints / topk);
  for (int64_t a = 0; a < rows; a += piece) {
    const int64_t m = std::min(piece, rows - a);
    TopkParams tp{};
    tp.logits = logits + a * stride;
    tp.stride = stride;
    tp.row_visible = row_visible + a;
    tp.num_rows = static_cast<int32_t>(m);
    tp.topk = topk;
    tp.out = direct_out != nullptr ? direct_out + a * topk : out_;
    tp.cand_keys = cand_keys_;
    tp.cand_pos = cand_pos_;
    tp.state = topk_state_;
    if (pool != nullptr) {
      tp.pool_blocks = pool->blocks + a * pool->topk_blocks;
      tp.pool_stride = pool->topk_blocks;
      tp.pool_block = pool->block_size;
    }
    PlanTopkSplit(tp.num_rows, max_visible, topk, props_.multiProcessorCount, ws_.cand, &tp);
    if (hist_ready) {
      // The logits kernel filled the rows' state for one cooperative piece
      // (TopkWantsHist); anything else would leave that state unconsumed.
      if (a != 0 || m != rows || tp.cand_stride == 0) {
        return absl::InternalError("top-k: fused histogram without its one cooperative piece");
      }
      tp.hist_ready = true;
    }
    RETURN_IF_ERROR(BeginSpan());
    RETURN_IF_ERROR(LaunchTopk(tp, stream_));
    RETURN_IF_ERROR(EndSpan(us));
    RETURN_IF_ERROR(piece_done(a, m));
  }
  return absl::OkStatus();
}

bool GpuBackend::TopkWantsHist(int64_t rows, int32_t max_visible, int32_t topk) const {
  if (topk <= 0 || rows > std::max<int64_t>(1, ws_.out_ints / topk)) return false;
  TopkParams tp{};
  PlanTopkSplit(static_cast<int32_t>(rows), max_visible, topk, props_.multiProcessorCount, ws_.cand, &tp);
  return tp.cand_stride > 0;
}

absl::Status GpuBackend::CheckDenseArgs(const PageLayout& layout,
                                        const QInput& q, int32_t topk,
                                        int32_t num_rows,
                                        const int32_t* out) const {
  if (topk < 0) return Bad("topk", ">= 0", topk);
  if (q.num_heads < 1 || q.num_heads > ws_.max_heads) {
    return Bad("q.num_heads", absl::StrCat("in [1, ", ws_.max_heads, "]"), q.num_heads);
  }
  if (num_rows == 0 || topk == 0) return absl::OkStatus();
  RETURN_IF_ERROR(CheckQTensors(layout, q));
  if (out == nullptr) return absl::InvalidArgumentError("out: expected a buffer, got null");
  return absl::OkStatus();
}

absl::Status GpuBackend::CheckQTensors(const PageLayout& layout, const QInput& q) {
  const bool mx = layout.format == KvFormat::kMxfp4;
  if (q.values == nullptr || q.weights == nullptr || (mx && q.scales == nullptr)) {
    return absl::InvalidArgumentError(absl::StrCat(
        "q: expected values, weights", mx ? " and scales" : "", " tensors, got null"));
  }
  return absl::OkStatus();
}

absl::StatusOr<LayerTimings> GpuBackend::DenseTopk(
    const PageLayout& layout, PoolHandle pool_h, const StepRows& rows,
    StepContext* ctx, const QInput& q, int32_t topk, int32_t* out) {
  LayerTimings t;
  RETURN_IF_ERROR(DenseImpl(layout, pool_h, rows, ctx, q, topk, out, &t, /*nested=*/false));
  return t;
}

absl::Status GpuBackend::DenseImpl(const PageLayout& layout, PoolHandle pool_h,
                                   const StepRows& rows, StepContext* ctx, const QInput& q,
                                   int32_t topk, int32_t* out, LayerTimings* timings,
                                   bool nested) {
  ASSIGN_OR_RETURN(const Pool p, FindPool(pool_h, layout));
  uint8_t* const pool = p.data;
  ASSIGN_OR_RETURN(Step * step, CheckedStep(layout, rows, ctx, p));
  RETURN_IF_ERROR(CheckDenseArgs(layout, q, topk, rows.num_rows, out));
  if (rows.num_rows == 0 || topk == 0) return absl::OkStatus();
  std::unique_ptr<Step> owned;
  if (step == nullptr) {
    ASSIGN_OR_RETURN(owned, MakeStep(layout, rows));
    step = owned.get();
  }
  CallScope call(this, nested);
  RETURN_IF_ERROR(call.Begin());
  // The logits span may start where the write's ended, and the top-k's
  // where the logits' did (BeginSpan: only if nothing ran in between).
  chain_next_span_ = true;
  RETURN_IF_ERROR(DenseWalk(p, layout, pool, step, q, timings, [&](const SubChunk& sc) {
    const int64_t rb = sc.row_begin;
    chain_next_span_ = true;
    // A device output takes the top-k straight from the kernel (no copy
    // through out_, one call less per layer).
    int32_t* const direct = out_device_ ? out + rb * topk : nullptr;
    return TopkPieces(logits_, sc.stride, step->dev().row_visible + rb, sc.row_end - rb,
                      sc.max_visible, topk, &timings->topk_us, [&](int64_t a, int64_t m) {
                        if (direct != nullptr) return absl::OkStatus();
                        return Emit(out + (rb + a) * topk, out_, m * topk * 4);
                      }, direct, topk_hist_ready_);
  }, /*gather=*/nullptr, topk));
  RETURN_IF_ERROR(call.End());
  return absl::OkStatus();
}

absl::Status GpuBackend::ReadEntries(const PageLayout& layout,
                                     PoolHandle pool_h, int32_t page,
                                     int32_t first, int32_t count,
                                     uint8_t* out) {
  ASSIGN_OR_RETURN(const Pool p, FindPool(pool_h, layout));
  uint8_t* const pool = p.data;
  RETURN_IF_ERROR(CheckReadEntriesArgs(layout, p.num_pages, page, first, count, out));
  if (count == 0) return absl::OkStatus();
  std::vector<uint8_t> host(static_cast<size_t>(p.page_bytes));
  {
    absl::MutexLock lock(&mu_);
    GPU_RETURN_IF_ERROR(CopyD2H(host.data(), pool + layout.PageOffset(page), host.size(), stream_));
    GPU_RETURN_IF_ERROR(StreamSynchronize(stream_));
  }
  for (int32_t i = 0; i < count; ++i) {
    LoadEntry(layout, host.data(), first + i, out + static_cast<int64_t>(i) * layout.entry_bytes());
  }
  return absl::OkStatus();
}

}  // namespace gpu

int GpuDeviceCount() {
  int n = 0;
  if (gpu::GetDeviceCount(&n) != gpu::kSuccess) {
    (void)gpu::GetLastError();
    return 0;
  }
  return n;
}

absl::StatusOr<std::unique_ptr<Backend>> MakeGpuBackend(int ordinal,
                                                        int /*threads*/) {
  ASSIGN_OR_RETURN(std::unique_ptr<gpu::GpuBackend> b, gpu::GpuBackend::Create(ordinal));
  return std::unique_ptr<Backend>(std::move(b));
}

}  // namespace indexer

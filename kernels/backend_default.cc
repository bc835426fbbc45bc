// Backend's default RunLayer: the composition of the single-path calls.
// In a library of its own below both backends (their vtables refer to it).
#include "absl/strings/str_cat.h"
#include "kernels/backend.h"
#include "kernels/common/status_macros.h"

namespace indexer {

HostBufferPool& Backend::host_buffers() {
  absl::call_once(heap_buffers_once_, [this] { heap_buffers_ = HostBufferPool::Heap(); });
  return *heap_buffers_;
}

absl::StatusOr<LayerTimings> Backend::RunLayer(PoolHandle pool_h, StepContext* ctx,
                                               const LayerWork& work) {
  if (ctx == nullptr) {
    return absl::InvalidArgumentError("ctx: expected the step's context from PrepareStep");
  }
  const PageLayout& layout = pool_h.layout;
  const StepRows& rows = ctx->rows();
  if ((work.k != nullptr && work.k->on_device) || work.q.on_device || work.out_on_device) {
    return absl::FailedPreconditionError(absl::StrCat(
        "device tensors need the gpu backend; this daemon runs the ", Kind(), " backend"));
  }
  LayerTimings t;
  if (work.k != nullptr && rows.NewEntries() > 0) {
    ASSIGN_OR_RETURN(t.write_us, WriteEntries(layout, pool_h, rows, ctx, *work.k));
  }
  absl::StatusOr<LayerTimings> r;
  switch (work.kind) {
    case LayerKind::kDense:
      r = DenseTopk(layout, pool_h, rows, ctx, work.q, work.topk, work.out);
      break;
    case LayerKind::kCandidateSource:
      r = CandidateSource(layout, pool_h, rows, ctx, work.q, work.topk, work.candidate, work.out);
      break;
    case LayerKind::kCandidateConsumer:
      r = CandidateConsumer(layout, pool_h, rows, ctx, work.q, work.topk, work.candidate, work.mode,
                            work.out);
      break;
    case LayerKind::kBlock:
      r = BlockTopk(layout, pool_h, rows, ctx, work.block_q, work.block, work.out);
      break;
  }
  if (!r.ok()) return r.status();
  r->write_us = t.write_us;
  return r;
}

}  // namespace indexer

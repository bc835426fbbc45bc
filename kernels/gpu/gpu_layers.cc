// The gpu backend's layer calls: RunLayer (one enqueue and one wait per
// layer) and the candidate and block paths it and the single-path calls
// share. The dense path and the stream helpers are gpu_backend.cc.
#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstring>
#include <memory>

#include "absl/cleanup/cleanup.h"
#include "absl/strings/str_cat.h"
#include "kernels/common/status_macros.h"
#include "kernels/gpu/gather_logits.h"
#include "kernels/gpu/gpu_backend_impl.h"
#include "kernels/gpu/gpu_step.h"

namespace indexer {
namespace gpu {

absl::StatusOr<LayerTimings> GpuBackend::RunLayer(PoolHandle pool_h, StepContext* ctx,
                                                  const LayerWork& work) {
  // The step's rows and their device copy live in the context (made once
  // by PrepareStep); the layout is the pool's.
  if (ctx == nullptr) {
    return absl::InvalidArgumentError("ctx: expected the step's context from PrepareStep");
  }
  const auto begin = std::chrono::steady_clock::now();
  const PageLayout& layout = pool_h.layout;
  const StepRows& rows = ctx->rows();
  LayerTimings timings;
  CallScope call(this, /*nested=*/false);
  RETURN_IF_ERROR(call.Begin());
  out_device_ = work.out_on_device;
  // Every device input's value check in one launch, before the layer's
  // work (the write and the dense walk then launch none of their own).
  RETURN_IF_ERROR(LaunchDeviceChecks(layout, rows, work.k,
                                     work.kind == LayerKind::kBlock ? nullptr : &work.q));
  checks_launched_ = true;
  if (work.k != nullptr && rows.NewEntries() > 0) {
    RETURN_IF_ERROR(WriteImpl(layout, pool_h, rows, ctx, *work.k, &timings.write_us, true));
  }
  switch (work.kind) {
    case LayerKind::kDense:
      RETURN_IF_ERROR(
          DenseImpl(layout, pool_h, rows, ctx, work.q, work.topk, work.out, &timings, true));
      break;
    case LayerKind::kCandidateSource:
      RETURN_IF_ERROR(SourceImpl(layout, pool_h, rows, ctx, work.q, work.topk, work.candidate,
                                 work.out, &timings, true));
      break;
    case LayerKind::kCandidateConsumer:
      RETURN_IF_ERROR(ConsumerImpl(layout, pool_h, rows, ctx, work.q, work.topk, work.candidate,
                                   work.mode, work.out, &timings, true));
      break;
    case LayerKind::kBlock:
      RETURN_IF_ERROR(
          BlockImpl(layout, pool_h, rows, ctx, work.block_q, work.block, work.out, &timings, true));
      break;
  }
  // The layer's one wait; the spans' times land in `timings` here.
  const auto issued = std::chrono::steady_clock::now();
  RETURN_IF_ERROR(call.End());
  const auto done = std::chrono::steady_clock::now();
  timings.enqueue_us = std::chrono::duration<double, std::micro>(issued - begin).count();
  timings.wait_us = std::chrono::duration<double, std::micro>(done - issued).count();
  return timings;
}

absl::Status GpuBackend::CopyDeviceToHost(void* dst, const void* device_src, int64_t bytes) {
  if (bytes == 0) return absl::OkStatus();
  if (dst == nullptr || device_src == nullptr || bytes < 0) {
    return absl::InvalidArgumentError(absl::StrCat(
        "device copy: expected buffers and a byte count >= 0, got ", bytes, " bytes"));
  }
  CallScope call(this, /*nested=*/false);
  RETURN_IF_ERROR(call.Begin());
  RETURN_IF_ERROR(Download(dst, device_src, bytes));
  return call.End();
}

namespace {

absl::Status Bad(absl::string_view field, absl::string_view expected, int64_t got) {
  return absl::InvalidArgumentError(absl::StrCat(field, ": expected ", expected, ", got ", got));
}

absl::Status CheckCandidateSpec(const CandidateSpec& spec) {
  if (spec.set < 0) return Bad("candidate set", ">= 0", spec.set);
  if (spec.block_size < 1) return Bad("candidate_block_size", ">= 1", spec.block_size);
  if (spec.topk_blocks < 1) return Bad("candidate_topk_blocks", ">= 1", spec.topk_blocks);
  return absl::OkStatus();
}

int32_t CeilDiv(int32_t a, int32_t b) { return (a + b - 1) / b; }

}  // namespace

absl::StatusOr<GpuBackend::Step*> GpuBackend::CandidateStep(
    const PageLayout& layout, const StepRows& rows, StepContext* ctx,
    const Pool& p) {
  if (ctx == nullptr) {
    return absl::InvalidArgumentError(
        "ctx: expected the step's context from PrepareStep (candidate pools live in it)");
  }
  return CheckedStep(layout, rows, ctx, p);
}

absl::StatusOr<LayerTimings> GpuBackend::CandidateSource(
    const PageLayout& layout, PoolHandle pool_h, const StepRows& rows,
    StepContext* ctx, const QInput& q, int32_t topk, const CandidateSpec& spec,
    int32_t* out) {
  LayerTimings t;
  RETURN_IF_ERROR(SourceImpl(layout, pool_h, rows, ctx, q, topk, spec, out, &t, /*nested=*/false));
  return t;
}

absl::Status GpuBackend::SourceImpl(const PageLayout& layout, PoolHandle pool_h,
                                    const StepRows& rows, StepContext* ctx, const QInput& q,
                                    int32_t topk, const CandidateSpec& spec, int32_t* out,
                                    LayerTimings* timings, bool nested) {
  ASSIGN_OR_RETURN(const Pool p, FindPool(pool_h, layout));
  uint8_t* const pool = p.data;
  ASSIGN_OR_RETURN(Step * step, CandidateStep(layout, rows, ctx, p));
  RETURN_IF_ERROR(CheckCandidateSpec(spec));
  RETURN_IF_ERROR(CheckDenseArgs(layout, q, topk, rows.num_rows, out));
  // The pools need the logits even when the source's own top-k is empty.
  if (rows.num_rows > 0) RETURN_IF_ERROR(CheckQTensors(layout, q));
  const int64_t n = rows.num_rows, k = spec.topk_blocks;
  Step::CandPool cands;
  cands.block_size = spec.block_size;
  cands.topk_blocks = spec.topk_blocks;
  cands.row_visible = rows.row_visible;
  ASSIGN_OR_RETURN(cands.mem, step->arena()->Allocate(std::max<int64_t>(1, n * (k + 1)) * 4,
                                                      "candidate pools"));
  cands.blocks = reinterpret_cast<int32_t*>(cands.mem);
  cands.entries = cands.blocks + n * k;
  // Gives the pools back unless they are published.
  auto release = absl::MakeCleanup([&] {
    if (cands.mem != nullptr) step->arena()->Release(cands.mem);
  });
  if (n > 0) {
    CallScope call(this, nested);
    RETURN_IF_ERROR(call.Begin());
    chain_next_span_ = true;  // see DenseImpl
    RETURN_IF_ERROR(DenseWalk(p, layout, pool, step, q, timings, [&](const SubChunk& sc) {
      const int64_t rb = sc.row_begin, nr = sc.row_end - sc.row_begin;
      const int32_t* visible = step->dev().row_visible + rb;
      chain_next_span_ = true;
      if (topk > 0) {
        RETURN_IF_ERROR(TopkPieces(logits_, sc.stride, visible, nr, sc.max_visible, topk,
                                   &timings->topk_us, [&](int64_t a, int64_t m) {
                                     return Emit(out + (rb + a) * topk, out_, m * topk * 4);
                                   }));
      }
      // The pools, from the same logits: block maxima in place, their top
      // k blocks, then the pin and the ascending order.
      const int32_t max_blocks = CeilDiv(sc.max_visible, spec.block_size);
      BlockMaxParams mp{logits_, sc.stride, visible, static_cast<int32_t>(nr), spec.block_size, aux_};
      // Out of place after the sub-chunk's logits where the workspace has
      // room (then every SM works on every row), else in place.
      const int64_t at = (nr * sc.stride + 3) / 4 * 4, mstride = (int64_t{max_blocks} + 3) / 4 * 4;
      if (at + nr * mstride <= ws_.logits_floats) {
        mp.maxima = logits_ + at;
        mp.maxima_stride = mstride;
      }
      float* const maxima = mp.maxima != nullptr ? mp.maxima : logits_;
      const int64_t max_stride = mp.maxima != nullptr ? mstride : sc.stride;
      RETURN_IF_ERROR(BeginSpan());
      RETURN_IF_ERROR(LaunchBlockMaxima(mp, max_blocks, stream_));
      RETURN_IF_ERROR(EndSpan(&timings->topk_us));
      return TopkPieces(maxima, max_stride, aux_, nr, max_blocks, spec.topk_blocks,
                        &timings->topk_us, [&](int64_t a, int64_t m) {
                          PoolParams pp{};
                          pp.sel = out_;
                          pp.sel_stride = k;
                          pp.maxima = maxima + a * max_stride;
                          pp.stride = max_stride;
                          pp.row_visible = visible + a;
                          pp.num_rows = static_cast<int32_t>(m);
                          pp.topk_blocks = spec.topk_blocks;
                          pp.block_size = spec.block_size;
                          pp.pin_newest = spec.pin_newest;
                          pp.blocks = cands.blocks + (rb + a) * k;
                          pp.entries = cands.entries + rb + a;
                          return LaunchFinishPool(pp, max_blocks, stream_);
                        });
    }));
    RETURN_IF_ERROR(call.End());
  }
  step->PutPool(spec.set, std::move(cands));
  cands.mem = nullptr;
  return absl::OkStatus();
}

absl::StatusOr<LayerTimings> GpuBackend::CandidateConsumer(
    const PageLayout& layout, PoolHandle pool_h, const StepRows& rows,
    StepContext* ctx, const QInput& q, int32_t topk, const CandidateSpec& spec,
    ConsumerMode mode, int32_t* out) {
  LayerTimings t;
  RETURN_IF_ERROR(ConsumerImpl(layout, pool_h, rows, ctx, q, topk, spec, mode, out, &t, /*nested=*/false));
  return t;
}

absl::Status GpuBackend::ConsumerImpl(const PageLayout& layout, PoolHandle pool_h,
                                      const StepRows& rows, StepContext* ctx, const QInput& q,
                                      int32_t topk, const CandidateSpec& spec, ConsumerMode mode,
                                      int32_t* out, LayerTimings* timings, bool nested) {
  ASSIGN_OR_RETURN(const Pool p, FindPool(pool_h, layout));
  uint8_t* const pool = p.data;
  ASSIGN_OR_RETURN(Step * step, CandidateStep(layout, rows, ctx, p));
  RETURN_IF_ERROR(CheckCandidateSpec(spec));
  if (topk < 0) return Bad("topk", ">= 0", topk);
  const Step::CandPool* cands = step->GetPool(spec.set);
  if (cands == nullptr) {
    return absl::FailedPreconditionError(
        absl::StrCat("candidate set ", spec.set, ": the source layer has not run in this step"));
  }
  if (cands->block_size != spec.block_size || cands->topk_blocks != spec.topk_blocks) {
    return absl::InvalidArgumentError(absl::StrCat(
        "candidate set ", spec.set, ": expected the source's block_size ", cands->block_size,
        " and topk_blocks ", cands->topk_blocks, ", got ", spec.block_size, " and ",
        spec.topk_blocks));
  }
  if (cands->row_visible != rows.row_visible) {
    return absl::InvalidArgumentError(absl::StrCat(
        "rows: expected the rows candidate set ", spec.set, "'s source ran on (",
        cands->row_visible.size(), " rows with the same visible entries), got ", rows.num_rows,
        " rows"));
  }
  RETURN_IF_ERROR(CheckDenseArgs(layout, q, topk, rows.num_rows, out));
  if (rows.num_rows == 0 || topk == 0) return absl::OkStatus();
  const int64_t k = spec.topk_blocks;
  const int64_t pool_entries = k * spec.block_size;
  CallScope call(this, nested);
  RETURN_IF_ERROR(call.Begin());
  // The length gate (SPEC §5; never visible in results): gather the pool
  // when the widest row sees more than gate_ratio x its entries and the
  // gather walk takes the call (GatherLogitsSupported: FP8 e4m3fn on the
  // sm_90a wgmma kernels, or MXFP4 on linear pages of a multiple of 64
  // entries with pool blocks of a multiple of 8 entries; H 16/32/64),
  // else mask a dense walk. kGather / kMasked force the choice where the
  // walk exists.
  const int32_t max_visible = *std::max_element(rows.row_visible.begin(), rows.row_visible.end());
  LogitsParams probe{};
  probe.layout = layout;
  probe.num_heads = q.num_heads;
  probe.max_group_rows = 1;
  probe.gather_block = spec.block_size;
  // Gather on the wgmma kernels only where wgmma is the cap (2): lower caps
  // and the MFMA requests (3, 4) walk masked.
  const bool can_gather = max_path_ == 2 && GatherLogitsSupported(probe, props_.major, props_.minor);
  const bool gather =
      can_gather && mode != ConsumerMode::kMasked &&
      (mode == ConsumerMode::kGather || max_visible > std::max<int64_t>(spec.gate_ratio, 1) * pool_entries);
  GatherWalk walk{};
  if (gather) {
    Step::CandPool* mp = step->MutablePool(spec.set);
    if (mp->gather_mem == nullptr) {
      // Made once per step and set: the rows and the pool size fix it.
      std::vector<LogitsGroup> groups;
      std::vector<LogitsUnit> units;
      std::vector<std::pair<int32_t, int32_t>> ranges;
      for (const SubChunk& sc : step->plan().chunks) {
        const int32_t u0 = static_cast<int32_t>(units.size());
        PlanGather(rows, sc.row_begin, sc.row_end, pool_entries, props_.multiProcessorCount, &groups, &units);
        ranges.emplace_back(u0, static_cast<int32_t>(units.size()));
      }
      const int64_t ub = static_cast<int64_t>(units.size() * sizeof(LogitsUnit));
      const int64_t gb = static_cast<int64_t>(groups.size() * sizeof(LogitsGroup));
      ASSIGN_OR_RETURN(uint8_t* mem, step->arena()->Allocate(std::max<int64_t>(ub + gb, 64), "gather walk"));
      mp->gather_mem = mem;
      mp->gather_host_units = std::move(units);
      mp->gather_host_groups = std::move(groups);
      mp->gather_ranges = std::move(ranges);
      mp->gather_units = reinterpret_cast<const LogitsUnit*>(mem);
      mp->gather_groups = reinterpret_cast<const LogitsGroup*>(mem + ub);
      if (ub > 0) RETURN_IF_ERROR(Upload(mem, mp->gather_host_units.data(), ub));
      if (gb > 0) RETURN_IF_ERROR(Upload(mem + ub, mp->gather_host_groups.data(), gb));
    }
    walk = {mp->gather_groups, mp->gather_units, &mp->gather_ranges, cands->blocks, cands->entries,
            spec.topk_blocks, spec.block_size};
  }
  RETURN_IF_ERROR(DenseWalk(p, layout, pool, step, q, timings, [&](const SubChunk& sc) {
    const int64_t rb = sc.row_begin, nr = sc.row_end - sc.row_begin;
    // The top-k runs over the rows' pool slots (lengths: the rows' pool
    // entries) and writes the entries the slots hold (PoolMap): a pool of
    // <= topk entries is listed whole, ascending, without its logits. The
    // gather walk wrote each row's logits at its slots, so no kernel sits
    // between the logits and the top-k; the masked walk's rows are
    // compacted to their slots first (GatherPoolKernel).
    if (!gather) {
      PoolGatherParams gp{};
      gp.logits = logits_;
      gp.stride = sc.stride;
      gp.blocks = cands->blocks + rb * k;
      gp.entries = cands->entries + rb;
      gp.num_rows = static_cast<int32_t>(nr);
      gp.topk_blocks = spec.topk_blocks;
      gp.block_size = spec.block_size;
      gp.topk = topk;
      RETURN_IF_ERROR(BeginSpan());
      RETURN_IF_ERROR(LaunchGatherPool(gp, stream_));
      RETURN_IF_ERROR(EndSpan(&timings->topk_us));
    }
    const int32_t max_slots =
        static_cast<int32_t>(std::min<int64_t>(sc.max_visible, pool_entries));
    const PoolMap map{cands->blocks + rb * k, spec.topk_blocks, spec.block_size};
    // A device output takes the top-k straight from the kernel, as DenseImpl's.
    int32_t* const direct = out_device_ ? out + rb * topk : nullptr;
    return TopkPieces(logits_, sc.stride, cands->entries + rb, nr, max_slots, topk, &timings->topk_us,
                      [&](int64_t a, int64_t m) {
                        if (direct != nullptr) return absl::OkStatus();
                        return Emit(out + (rb + a) * topk, out_, m * topk * 4);
                      }, direct, /*hist_ready=*/false, &map);
  }, gather ? &walk : nullptr));
  RETURN_IF_ERROR(call.End());
  return absl::OkStatus();
}

absl::StatusOr<LayerTimings> GpuBackend::BlockTopk(
    const PageLayout& layout, PoolHandle pool_h, const StepRows& rows,
    StepContext* ctx, const BlockQInput& q, const BlockSpec& spec, int32_t* out) {
  LayerTimings t;
  RETURN_IF_ERROR(BlockImpl(layout, pool_h, rows, ctx, q, spec, out, &t, /*nested=*/false));
  return t;
}

absl::Status GpuBackend::BlockImpl(const PageLayout& layout, PoolHandle pool_h,
                                   const StepRows& rows, StepContext* ctx, const BlockQInput& q,
                                   const BlockSpec& spec, int32_t* out, LayerTimings* timings,
                                   bool nested) {
  ASSIGN_OR_RETURN(const Pool p, FindPool(pool_h, layout));
  uint8_t* const pool = p.data;
  if (layout.format != KvFormat::kMxfp4) {
    return absl::InvalidArgumentError(absl::StrCat(
        "layout: the block path expected MXFP4 K pages, got ", KvFormatName(layout.format)));
  }
  ASSIGN_OR_RETURN(Step * step, CheckedStep(layout, rows, ctx, p));
  if (spec.topk_blocks < 0) return Bad("topk_blocks", ">= 0", spec.topk_blocks);
  if (spec.init_blocks < 0) return Bad("init_blocks", ">= 0", spec.init_blocks);
  if (spec.local_blocks < 0) return Bad("local_blocks", ">= 0", spec.local_blocks);
  if (!std::isfinite(spec.scale) || spec.scale <= 0) {
    return absl::InvalidArgumentError(absl::StrCat(
        "scale: expected a finite value > 0 (D^-0.5), got ", spec.scale));
  }
  // Q [rows, Hi, D] fp32 travels in the Q staging sized for H 128 x 128 B.
  const int32_t max_block_heads = ws_.max_heads * 128 / (4 * layout.head_dim);
  if (q.num_heads < 1 || q.num_heads > max_block_heads) {
    return Bad("q.num_heads", absl::StrCat("in [1, ", max_block_heads, "]"), q.num_heads);
  }
  if (rows.num_rows == 0 || spec.topk_blocks == 0) return absl::OkStatus();
  if (q.q == nullptr) return absl::InvalidArgumentError("q: expected a [rows, Hi, D] tensor, got null");
  if (out == nullptr) return absl::InvalidArgumentError("out: expected a buffer, got null");
  std::unique_ptr<Step> owned;
  if (step == nullptr) {
    ASSIGN_OR_RETURN(owned, MakeStep(layout, rows));
    step = owned.get();
  }
  const int64_t heads = q.num_heads, dim = layout.head_dim, k = spec.topk_blocks;
  CallScope call(this, nested);
  RETURN_IF_ERROR(call.Begin());
  // The streaming kernel's work map: once per step and page size.
  const int32_t ctas = BlockWorkMapCtas(props_.major, props_.multiProcessorCount, max_path_);
  const Step::BlockMap* map = nullptr;
  if (ctas > 0) {
    Step::BlockMap* m = step->MutableBlockMap(layout.page_entries);
    if (m->mem == nullptr) {
      std::vector<int32_t> starts, pairs;
      RETURN_IF_ERROR(PlanBlockWork(rows, layout.page_entries, step->plan().chunks, ctas, &starts,
                                    &pairs, &m->cta_offsets));
      m->host = std::move(starts);
      const int64_t nstarts = static_cast<int64_t>(m->host.size());
      m->host.insert(m->host.end(), pairs.begin(), pairs.end());
      const int64_t bytes = static_cast<int64_t>(m->host.size()) * 4;
      ASSIGN_OR_RETURN(m->mem, step->arena()->Allocate(bytes, "block work map"));
      m->starts = reinterpret_cast<const int32_t*>(m->mem);
      m->cta = m->starts + nstarts;
      m->ctas = ctas;
      RETURN_IF_ERROR(Upload(m->mem, m->host.data(), bytes));
    }
    map = m;
  }
  const std::vector<SubChunk>& chunks = step->plan().chunks;
  for (size_t ci = 0; ci < chunks.size(); ++ci) {
    const SubChunk& sc = chunks[ci];
    const int64_t rb = sc.row_begin, nr = sc.row_end - sc.row_begin;
    const int32_t width = CeilDiv(sc.max_visible, layout.page_entries);
    if (heads * nr * width > ws_.logits_floats || heads * nr > int64_t{ws_.max_rows} * 64) {
      return absl::ResourceExhaustedError(absl::StrCat(
          "block scores: ", heads, " heads x ", nr, " rows x ", width,
          " blocks exceed the gpu workspace"));
    }
    RETURN_IF_ERROR(Upload(q_values_, q.q + rb * heads * dim, nr * heads * dim * 4));
    BlockScoreParams bp{};
    bp.layout = layout;
    bp.pool = pool;
    bp.step = step->dev();
    bp.row_base = static_cast<int32_t>(rb);
    bp.num_rows = static_cast<int32_t>(nr);
    bp.num_heads = q.num_heads;
    bp.q = reinterpret_cast<const float*>(q_values_);
    bp.scale = spec.scale;
    bp.init_blocks = spec.init_blocks;
    bp.local_blocks = spec.local_blocks;
    bp.scores = logits_;
    bp.width = width;
    bp.causal = aux_;
    bp.use_tma = p.has_block_tmap;
    bp.tmap = p.block_tmap;
    bp.trace = trace_;
    bp.trace_blocks = trace_blocks_;
    BlockWorkMap wm{};
    if (map != nullptr) wm = {map->starts, map->cta + map->cta_offsets[ci], map->ctas};
    // The kernel choice: logits_dispatch.cc (set_max_logits_path 0 keeps
    // the portable kernel, 1 the mma.sync one, for tests).
    const char* which = "block_portable";
    RETURN_IF_ERROR(BeginSpan());
    RETURN_IF_ERROR(LaunchBlockScorePath(bp, map != nullptr ? &wm : nullptr, props_.major,
                                         props_.minor, props_.multiProcessorCount, stream_,
                                         max_path_, &which));
    RETURN_IF_ERROR(EndLogitsSpan(&timings->logits_us));
    last_path_ = which;
    // Top-k: every head's rows in one launch into out_ ([Hi, nr, k]), one
    // warp per (head, row), up to kWarpTopkWidth blocks; longer rows (or
    // outputs larger than out_) through the general top-k. The gate is
    // measured (H200, h200_2026-12-01_kblock.md): the warp kernel at 1024
    // blocks (128k) took 50-55 us against the general top-k's 36-43 (then
    // one launch a head); at 256 blocks 32-34 against 33-39.
    constexpr int32_t kWarpTopkWidth = 256;
    if (width <= std::min(BlockTopkMaxWidth(), kWarpTopkWidth) && heads * nr * k <= ws_.out_ints) {
      BlockTopkParams tp{};
      tp.scores = logits_;
      tp.width = width;
      tp.causal = aux_;
      tp.num_rows = static_cast<int32_t>(nr);
      tp.num_heads = q.num_heads;
      tp.topk = spec.topk_blocks;
      tp.out = out_;
      RETURN_IF_ERROR(BeginSpan());
      RETURN_IF_ERROR(LaunchBlockTopk(tp, stream_));
      RETURN_IF_ERROR(EndSpan(&timings->topk_us));
      for (int64_t h = 0; h < heads; ++h) {
        RETURN_IF_ERROR(Emit(out + (h * rows.num_rows + rb) * k, out_ + h * nr * k, nr * k * 4));
      }
      continue;
    }
    // The general top-k over all heads at once: the scores are [Hi, nr,
    // width] and the causal counts [Hi, nr], so head h's row r is row
    // h * nr + r of one [Hi * nr, width] launch (a launch a head cost its
    // fixed time Hi times: MiniMax B=1 x 128k, 2048 blocks, 36.4 us for
    // Hi 4). A piece's rows go to out ([Hi, num_rows, k]) split at heads.
    RETURN_IF_ERROR(TopkPieces(logits_, width, aux_, heads * nr, width, spec.topk_blocks,
                               &timings->topk_us, [&](int64_t a, int64_t m) {
                                 for (int64_t i = a; i < a + m;) {
                                   const int64_t h = i / nr, r = i % nr;
                                   const int64_t n = std::min(a + m - i, nr - r);
                                   RETURN_IF_ERROR(Emit(out + (h * rows.num_rows + rb + r) * k,
                                                        out_ + (i - a) * k, n * k * 4));
                                   i += n;
                                 }
                                 return absl::OkStatus();
                               }));
  }
  RETURN_IF_ERROR(call.End());
  return absl::OkStatus();
}

}  // namespace gpu
}  // namespace indexer

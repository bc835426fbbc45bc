// Benchmark of the gpu backend's dense path (SPEC §8 method): per shape the
// L2 is flushed (a 1 GiB buffer zeroed) before each DenseTopk call, the
// backend's CUDA events time its logits and top-k kernels, and the median
// of 30 calls is reported beside the ceilings measured here: device copy
// bandwidth (bytes read + written) and the mma.sync e4m3 rate the logits
// kernel is built on (the datasheet's dense FP8 wgmma peak alongside).
//
// The flush is enqueued and the call made at once (as a framework times a
// kernel after an asynchronous flush), so the events see only GPU work and
// no host launch gaps; "call us" comes from a second pass that waits for
// the flush before each call and times the host wall of DenseTopk.
//
// Usage: indexer_gpu_bench [--quick] [--clean-flush] [--sync-flush]
//        [--only NAME[,NAME...]] [--markdown FILE] [--iters N] [--host]
//        [--no-ceilings] [--stream-floor]
// --sync-flush waits for the flush before each timed call (the method of the
// 2026-11-29 tables: host launch gaps between the backend's events count).
// --clean-flush reads the first half of the flush buffer after zeroing it, so the timed
// kernels find clean lines in the L2 (the default leaves up to an L2 of dirty
// lines to write back during them).
// --trace adds, per selected decode shape, where its logits kernel's time
// goes (tests/bench/trace_stats.h: the launch outside the blocks, the
// blocks' start and end spreads, a block's fill, stream and drain, the math
// side's and the copy warp's waits), from the kernels' per-block records
// (kernels/gpu/trace_record.h) over --iters traced calls, after the untimed
// ones; its event time beside the untraced median shows what tracing costs.
// --stream-floor runs, per decode shape, a pure streaming kernel over the
// shape's K and logits bytes instead of the backend (RunStreamFloor): the
// floor a logits kernel could reach under the same flush.
// --host times what the server's RunLayer spends inside the backend: host
// wall time of WriteEntries (one new FP32 K entry per row) then DenseTopk,
// median of --iters, beside their kernel times; by default only for
// "decode fp8 B=64 next_n=1 n=32k" (--only picks others), then the copies
// of that shape alone. No ceilings.
#include "kernels/gpu/gpu_compat.h"  // first: the runtime defines __device__ & co.

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstring>
#include <memory>
#include <numeric>
#include <random>
#include <string>
#include <vector>

#include "absl/strings/str_format.h"
#include "kernels/backend.h"
#include "kernels/gpu/gpu_backend.h"
#include "kernels/gpu/gpu_backend_impl.h"
#include "tests/bench/bench_util.h"
#include "tests/bench/hopper/peaks.h"
#include "tests/bench/trace_stats.h"

namespace indexer {
namespace {

using bench::Median;

#define CHECK_OK(expr)                                                      \
  do {                                                                      \
    const auto& _s = (expr);                                                \
    if (!_s.ok()) {                                                         \
      std::fprintf(stderr, "%s failed: %s (%s:%d)\n", #expr,                \
                   std::string(_s.status().ToString()).c_str(), __FILE__,   \
                   __LINE__);                                               \
      std::exit(1);                                                         \
    }                                                                       \
  } while (0)

constexpr double kDatasheetFp8Tflops = 1979.0;  // H200 SXM dense FP8 (wgmma)

// Random, valid pages: e4m3 codes without NaN and power-of-two scales, or
// e2m1 nibbles and e8m0 scales near 2^0. Hash of the byte index, so any
// pool size fills in one pass.
__global__ void FillPoolKernel(uint8_t* pool, int64_t bytes, PageLayout l,
                               uint32_t seed) {
  for (int64_t i = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x; i < bytes;
       i += static_cast<int64_t>(gridDim.x) * blockDim.x) {
    uint32_t h = static_cast<uint32_t>(i) * 2654435761u ^ seed ^ static_cast<uint32_t>(i >> 32);
    h ^= h >> 15;
    h *= 2246822519u;
    h ^= h >> 13;
    const int64_t in_page = i % l.page_bytes();
    uint8_t v = static_cast<uint8_t>(h);
    if (in_page >= l.scale_region()) {
      const int64_t s = in_page - l.scale_region();
      if (l.format == KvFormat::kFp8) {
        // fp32 scale 2^-(4..11): byte 3 of the word is 0x3a..0x3d.
        const int b = static_cast<int>(s % 4);
        v = b < 2 ? 0 : b == 2 ? static_cast<uint8_t>(0x80 & h) : static_cast<uint8_t>(0x3a + (h % 4));
      } else {
        v = static_cast<uint8_t>(124 + h % 7);
      }
    } else if (l.format == KvFormat::kFp8 && (v & 0x7f) == 0x7f) {
      v ^= 1;
    }
    pool[i] = v;
  }
}

// Reads the flush buffer after zeroing it (--clean-flush): the zeroing
// leaves the L2 full of dirty lines that the timed kernels would otherwise
// write back; after this read the L2 holds clean lines of another buffer.
__global__ void ReadFlushKernel(const uint4* p, int64_t n, uint32_t* sink) {
  uint32_t acc = 0;
  for (int64_t i = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x; i < n;
       i += static_cast<int64_t>(gridDim.x) * blockDim.x) {
    const uint4 v = p[i];
    acc ^= v.x ^ v.y ^ v.z ^ v.w;
  }
  if (acc == 0x9e3779b9u) *sink = acc;  // keeps the loads; never true on zeros
}

// The bench's L2 flush on stream `s`: `bytes` of `flush` zeroed, and with
// `clean` the first half read back (long evicted): the zeroing's dirty lines
// (its last ones) then leave the L2 here, not during the timed kernels.
void FlushL2(void* flush, size_t bytes, bool clean, gpu::Stream s) {
  CHECK_GPU(gpu::MemsetAsync(flush, 0, bytes, s));
  if (!clean) return;
  const size_t half = bytes / 2;
  ReadFlushKernel<<<1024, 256, 0, s>>>(static_cast<const uint4*>(flush), static_cast<int64_t>(half / 16),
                                       static_cast<uint32_t*>(flush) + half / 4);
  CHECK_GPU(gpu::GetLastError());
}

// The events' own floor: an empty kernel of one 1024-thread block per SM
// between two events, queued behind the flush as a timed call's kernels are
// (median of 30). Every logits or top-k span holds one launch: a layer of
// two spans cannot take less than twice this.
__global__ void EmptyKernel() {}
double MeasureLaunchFloorUs(void* flush, size_t bytes, bool clean, int num_sms) {
  gpu::Event e0, e1;
  CHECK_GPU(gpu::EventCreate(&e0));
  CHECK_GPU(gpu::EventCreate(&e1));
  std::vector<double> t;
  for (int i = 0; i < 32; ++i) {
    FlushL2(flush, bytes, clean, nullptr);
    CHECK_GPU(gpu::EventRecord(e0, nullptr));
    EmptyKernel<<<num_sms, 1024, 0, nullptr>>>();
    CHECK_GPU(gpu::GetLastError());
    CHECK_GPU(gpu::EventRecord(e1, nullptr));
    CHECK_GPU(gpu::StreamSynchronize(nullptr));
    float ms = 0;
    CHECK_GPU(gpu::EventElapsedMs(&ms, e0, e1));
    if (i >= 2) t.push_back(ms * 1e3);
  }
  CHECK_GPU(gpu::EventDestroy(e0));
  CHECK_GPU(gpu::EventDestroy(e1));
  return Median(t);
}

// `md` to `path` (none when empty); false when it cannot be written.
bool WriteMarkdown(const std::string& path, const std::string& md) {
  if (path.empty()) return true;
  FILE* f = std::fopen(path.c_str(), "w");
  if (f == nullptr) {
    std::fprintf(stderr, "cannot write %s\n", path.c_str());
    return false;
  }
  std::fputs(md.c_str(), f);
  std::fclose(f);
  return true;
}

// --stream-floor: a pure streaming kernel in place of a shape's logits
// kernel, reading its K bytes once (16-byte loads, four in flight per
// thread, L1 not allocated; `kHint`: the L2 evict-first policy the logits
// kernels put on K) and writing its logits bytes as it goes (each thread
// spreads its share of the stores over its loads). What is left between
// this and the logits kernel is the kernel's own, not the flush's or the
// memory's. On HIP builds the hint is not applied (plain loads).
template <bool kHint>
__device__ __forceinline__ uint4 StreamLoad(const uint4* p, uint64_t policy) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 800
  uint4 v;
  if constexpr (kHint) {
    asm volatile("ld.global.nc.L1::no_allocate.L2::cache_hint.v4.u32 {%0, %1, %2, %3}, [%4], %5;\n"
                 : "=r"(v.x), "=r"(v.y), "=r"(v.z), "=r"(v.w) : "l"(p), "l"(policy));
  } else {
    asm volatile("ld.global.nc.L1::no_allocate.v4.u32 {%0, %1, %2, %3}, [%4];\n"
                 : "=r"(v.x), "=r"(v.y), "=r"(v.z), "=r"(v.w) : "l"(p));
  }
  return v;
#else
  (void)policy;
  return *p;
#endif
}

template <bool kHint>
__global__ void __launch_bounds__(512, 4) StreamKernel(const uint4* src, int64_t n16, uint4* dst, int64_t m16) {
  uint64_t policy = 0;
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 800
  if constexpr (kHint) asm volatile("createpolicy.fractional.L2::evict_first.b64 %0, 1.0;\n" : "=l"(policy));
#endif
  constexpr int kUnroll = 4;
  const int64_t stride = static_cast<int64_t>(gridDim.x) * blockDim.x;
  const int64_t t = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
  // This thread's loads (rounds of kUnroll) and stores, the stores spread
  // evenly over the rounds.
  const int64_t rounds = (n16 + kUnroll * stride - 1) / (kUnroll * stride);
  const int64_t stores = (m16 + stride - 1) / stride;
  uint32_t acc = static_cast<uint32_t>(t);
  int64_t w = 0;
  for (int64_t r = 0; r < rounds; ++r) {
    uint4 v[kUnroll];
#pragma unroll
    for (int u = 0; u < kUnroll; ++u) {
      const int64_t i = (r * kUnroll + u) * stride + t;
      v[u] = i < n16 ? StreamLoad<kHint>(src + i, policy) : make_uint4(0, 0, 0, 0);
    }
#pragma unroll
    for (int u = 0; u < kUnroll; ++u) acc ^= v[u].x ^ v[u].y ^ v[u].z ^ v[u].w;
    for (const int64_t w_end = (r + 1) * stores / rounds; w < w_end; ++w) {
      const int64_t j = w * stride + t;
      if (j < m16) dst[j] = make_uint4(acc, static_cast<uint32_t>(j), 0, 0);
    }
  }
  for (; w < stores; ++w) {
    const int64_t j = w * stride + t;
    if (j < m16) dst[j] = make_uint4(acc, static_cast<uint32_t>(j), 0, 0);
  }
}

struct Ceilings {
  double copy_gbs = 0;
  double mma_tflops = 0;
  double wgmma_tflops = 0;  // 0 where the build has no sm_90a wgmma
};

// The tensor-core rates of the build's paths: the sm_90 ones of
// tests/bench/hopper/ in CUDA builds (kHopperPaths); none elsewhere, and the
// table prints 0. A template so that a build without them names none.
template <bool kHopper = gpu::kHopperPaths>
void MeasureTensorPeaks(Ceilings* c, gpu::Event e0, gpu::Event e1) {
  if constexpr (kHopper) {
    const bench::TensorPeaks t = bench::MeasureHopperPeaks(e0, e1);
    c->mma_tflops = t.mma_tflops;
    c->wgmma_tflops = t.wgmma_tflops;
  }
  (void)c, (void)e0, (void)e1;
}

Ceilings MeasureCeilings() {
  Ceilings c;
  const size_t bytes = size_t{1} << 31;
  void *a = nullptr, *b = nullptr;
  CHECK_GPU(gpu::Malloc(&a, bytes));
  CHECK_GPU(gpu::Malloc(&b, bytes));
  CHECK_GPU(gpu::MemsetAsync(a, 1, bytes, nullptr));
  gpu::Event e0, e1;
  CHECK_GPU(gpu::EventCreate(&e0));
  CHECK_GPU(gpu::EventCreate(&e1));
  std::vector<double> t;
  for (int i = 0; i < 12; ++i) {
    CHECK_GPU(gpu::EventRecord(e0, nullptr));
    CHECK_GPU(gpu::CopyD2D(b, a, bytes, nullptr));
    CHECK_GPU(gpu::EventRecord(e1, nullptr));
    CHECK_GPU(gpu::StreamSynchronize(nullptr));
    float ms = 0;
    CHECK_GPU(gpu::EventElapsedMs(&ms, e0, e1));
    if (i >= 2) t.push_back(ms);
  }
  c.copy_gbs = 2.0 * bytes / (Median(t) * 1e-3) / 1e9;
  CHECK_GPU(gpu::Free(a));
  CHECK_GPU(gpu::Free(b));
  MeasureTensorPeaks(&c, e0, e1);
  return c;
}

// What one timed call runs: the dense path, a candidate source (dense
// top-k plus the pools), a candidate consumer (its set's pools built once by
// an untimed source call first; the length gate's choice, or the masked
// walk forced), or the MiniMax block path.
enum class BenchKind { kDense, kSource, kConsumer, kConsumerMasked, kBlock };

struct BenchShape {
  std::string name;
  KvFormat format;
  int32_t batch;
  int32_t q_len;     // next_n (decode) or prefill rows
  int32_t entries;   // entries of each sequence after the step (visible to its last row)
  int32_t topk = 2048;  // tokens, or blocks (kBlock)
  std::string target;
  int max_path = 2;  // logits path cap: 0 portable, 1 mma.sync, 2 wgmma
  int32_t heads = 64;      // H (Hi for kBlock)
  int32_t ratio = 1;       // compress ratio: a sequence holds entries x ratio tokens
  BenchKind kind = BenchKind::kDense;
  int32_t page = 64;       // entries per page (kBlock: the block)
  int32_t cand_block = 8;  // candidate_block_size
  int32_t cand_topk = 2048;  // candidate_topk_blocks (the pool)
};

struct Result {
  BenchShape shape;
  std::string path;
  double logits_us, topk_us, layer_us, call_us, gbs, tflops;
  double split_us = 0;  // logits_us + topk_us, each timed alone (the split pass)
  // The bytes the layer must read (K it scores, Q, weights, logits) at the
  // measured copy bandwidth: the logits kernel's floor.
  double copy_floor_us = 0;
  // --host: kernel time of the write, host wall time of WriteEntries and of
  // WriteEntries + DenseTopk (medians).
  double write_us = 0, write_call_us = 0, host_us = 0;
  // --trace: the traced calls' parts (medians); traced false where the
  // shape was not traced.
  bool traced = false;
  bench::TraceStats trace;
};

Result RunShape(const BenchShape& bs, const Ceilings& ceil, int iters,
                void* flush, size_t flush_bytes, bool clean_flush, bool host,
                bool sync_flush, bool trace) {
  const int32_t kHeads = bs.heads, kPage = bs.page;
  const bool block = bs.kind == BenchKind::kBlock;
  const PageLayout layout = *PageLayout::Make(bs.format, 128, kPage);
  auto made = gpu::GpuBackend::Create(0);
  CHECK_OK(made);
  std::unique_ptr<gpu::GpuBackend> be = std::move(*made);
  be->set_max_logits_path(bs.max_path);

  const int32_t per_seq = static_cast<int32_t>(PagesFor(bs.entries, kPage));
  const int64_t pages = static_cast<int64_t>(bs.batch) * per_seq;
  auto pool_or = be->AllocatePool(layout, pages);
  CHECK_OK(pool_or);
  const PoolHandle pool = *pool_or;
  FillPoolKernel<<<1024, 256>>>(pool.base, pages * layout.page_bytes(), layout, 12345u);
  CHECK_GPU(gpu::GetLastError());
  CHECK_GPU(gpu::StreamSynchronize(nullptr));

  std::mt19937 rng(42);
  std::vector<int32_t> perm(pages);
  std::iota(perm.begin(), perm.end(), 0);
  std::shuffle(perm.begin(), perm.end(), rng);
  std::vector<int64_t> old_tokens(bs.batch, static_cast<int64_t>(bs.entries) * bs.ratio - bs.q_len),
      q_lens(bs.batch, bs.q_len);
  std::vector<std::vector<int32_t>> seq_pages;
  for (int32_t s = 0; s < bs.batch; ++s) {
    seq_pages.emplace_back(perm.begin() + s * per_seq, perm.begin() + (s + 1) * per_seq);
  }
  // The server's chunks under a 512 MiB logits budget (vLLM's default).
  const StepRows rows =
      BuildStepRowsFromPages(old_tokens, q_lens, seq_pages, bs.ratio, int64_t{512} << 20);
  auto ctx_or = be->PrepareStep(layout, rows);
  CHECK_OK(ctx_or);
  std::unique_ptr<StepContext> ctx = std::move(*ctx_or);

  const int64_t nq = static_cast<int64_t>(rows.num_rows) * kHeads;
  std::vector<uint8_t> qv(static_cast<size_t>(nq * layout.value_bytes())), qs;
  for (auto& v : qv) {
    v = static_cast<uint8_t>(rng());
    if (bs.format == KvFormat::kFp8 && (v & 0x7f) == 0x7f) v ^= 1;
  }
  if (bs.format == KvFormat::kMxfp4) {
    qs.resize(static_cast<size_t>(nq * 4));
    for (auto& v : qs) v = static_cast<uint8_t>(124 + rng() % 7);
  }
  std::vector<float> w(static_cast<size_t>(nq));
  for (auto& x : w) x = static_cast<float>(rng() % 2000) / 1000.f - 1.f;
  QInput q;
  q.num_heads = kHeads;
  q.values = qv.data();
  q.scales = qs.empty() ? nullptr : qs.data();
  q.weights = w.data();
  // The block path's Q: [rows, Hi, D] fp32.
  std::vector<float> bqf(block ? static_cast<size_t>(nq) * 128 : 0);
  std::normal_distribution<float> normal(0.f, 1.f);
  for (auto& x : bqf) x = normal(rng);
  BlockQInput bq;
  bq.num_heads = kHeads;
  bq.q = bqf.data();
  BlockSpec bspec;
  bspec.topk_blocks = bs.topk;
  bspec.init_blocks = 0;
  bspec.local_blocks = 1;
  CandidateSpec cspec;
  cspec.block_size = bs.cand_block;
  cspec.topk_blocks = bs.cand_topk;
  std::vector<int32_t> out(static_cast<size_t>(rows.num_rows) * bs.topk * (block ? kHeads : 1));
  // The consumer's pools: one source call on other Q, before any timing.
  auto run = [&]() -> absl::StatusOr<LayerTimings> {
    switch (bs.kind) {
      case BenchKind::kDense:
        return be->DenseTopk(layout, pool, rows, ctx.get(), q, bs.topk, out.data());
      case BenchKind::kSource:
        return be->CandidateSource(layout, pool, rows, ctx.get(), q, bs.topk, cspec, out.data());
      case BenchKind::kConsumer:
      case BenchKind::kConsumerMasked:
        return be->CandidateConsumer(layout, pool, rows, ctx.get(), q, bs.topk, cspec,
                                     bs.kind == BenchKind::kConsumer ? ConsumerMode::kAuto : ConsumerMode::kMasked,
                                     out.data());
      case BenchKind::kBlock:
        return be->BlockTopk(layout, pool, rows, ctx.get(), bq, bspec, out.data());
    }
    return absl::InternalError("bench kind");
  };
  if (bs.kind == BenchKind::kConsumer || bs.kind == BenchKind::kConsumerMasked) {
    CHECK_OK(be->CandidateSource(layout, pool, rows, ctx.get(), q, bs.topk, cspec, out.data()));
  }
  // --host: the step's new K entries, rewritten at the same positions by
  // every call.
  std::vector<float> kf(host ? static_cast<size_t>(rows.NewEntries()) * 128 : 0);
  for (auto& x : kf) x = static_cast<float>(rng() % 2000) / 1000.f - 1.f;
  KInput k;
  k.kind = KInput::Kind::kFloat32;
  k.data = kf.data();

  std::vector<double> lt, tt, yt, st, ct, wt, wct, ht;
  // Three passes. Split: an event between the logits and the top-k, each
  // timed alone (the logits and top-k columns, and their sum: the method of
  // the peers' table). Joint: the backend's default, one span over the
  // logits and the first top-k side kernel (layer: as the daemon runs and
  // times it). Kernel passes leave the flush unwaited (unless --sync-flush
  // or --host); the call pass (host wall times, joint) waits for it.
  const bool wait_flush = sync_flush || host;
  const int call_iters = wait_flush ? 0 : std::max(5, iters / 3);
  enum class Pass { kSplit, kJoint, kCall };
  for (const Pass pass : {Pass::kSplit, Pass::kJoint, Pass::kCall}) {
    if (pass == Pass::kCall && call_iters == 0) continue;
    be->set_split_timing(pass == Pass::kSplit);
    const int warm = pass == Pass::kCall ? 1 : 2;
    const int n = warm + (pass == Pass::kCall ? call_iters : iters);
    for (int i = 0; i < n; ++i) {
      // On the backend's stream: its events then follow the flush.
      const gpu::Stream fs = be->stream_for_bench();
      FlushL2(flush, flush_bytes, clean_flush, fs);
      if (wait_flush || pass == Pass::kCall) CHECK_GPU(gpu::StreamSynchronize(fs));
      const auto t0 = std::chrono::steady_clock::now();
      const absl::StatusOr<double> w = host && pass == Pass::kSplit
                                           ? be->WriteEntries(layout, pool, rows, ctx.get(), k)
                                           : absl::StatusOr<double>(0.0);
      const auto t1 = std::chrono::steady_clock::now();
      auto t = run();
      const auto t2 = std::chrono::steady_clock::now();
      const double call = std::chrono::duration<double, std::micro>(t2 - t1).count();
      CHECK_OK(w);
      CHECK_OK(t);
      if (i < warm) continue;  // warm-ups
      switch (pass) {
        case Pass::kSplit:
          wt.push_back(*w);
          wct.push_back(std::chrono::duration<double, std::micro>(t1 - t0).count());
          ht.push_back(std::chrono::duration<double, std::micro>(t2 - t0).count());
          lt.push_back(t->logits_us);
          tt.push_back(t->topk_us);
          st.push_back(t->logits_us + t->topk_us);
          if (wait_flush) ct.push_back(call);
          break;
        case Pass::kJoint:
          yt.push_back(t->logits_us + t->topk_us);
          break;
        case Pass::kCall:
          ct.push_back(call);
          break;
      }
    }
  }
  Result r{bs, be->last_logits_path(), Median(lt), Median(tt), Median(yt), Median(ct), 0, 0};
  // --trace: decode shapes only (one logits launch a call: a prefill's
  // sub-chunks would overwrite each other's records). Split timing, so the
  // event time is the logits kernel's alone.
  if (trace && bs.q_len <= gpu::kMaxGroupRows) {
    // On stderr, unbuffered: where a run that had to be killed stopped.
    std::fprintf(stderr, "%s: traced calls\n", bs.name.c_str());
    constexpr int32_t kTraceBlocks = 4096;  // above any persistent grid
    const size_t rec_bytes = size_t{kTraceBlocks} * gpu::kTraceWords * sizeof(uint64_t);
    void* rec_d = nullptr;
    CHECK_GPU(gpu::Malloc(&rec_d, rec_bytes));
    std::vector<uint64_t> rec_h(rec_bytes / sizeof(uint64_t));
    be->set_split_timing(true);
    be->set_bench_trace(static_cast<uint64_t*>(rec_d), kTraceBlocks);
    std::vector<bench::TraceStats> runs;
    for (int i = 0; i < 2 + iters; ++i) {
      const gpu::Stream fs = be->stream_for_bench();
      CHECK_GPU(gpu::MemsetAsync(rec_d, 0, rec_bytes, fs));
      FlushL2(flush, flush_bytes, clean_flush, fs);
      if (sync_flush) CHECK_GPU(gpu::StreamSynchronize(fs));
      auto t = run();
      CHECK_OK(t);
      if (i < 2) continue;
      CHECK_GPU(gpu::CopyD2H(rec_h.data(), rec_d, rec_bytes, fs));
      CHECK_GPU(gpu::StreamSynchronize(fs));
      runs.push_back(bench::SummarizeTrace(rec_h.data(), kTraceBlocks, t->logits_us));
    }
    be->set_bench_trace(nullptr, 0);
    CHECK_GPU(gpu::Free(rec_d));
    r.traced = true;
    r.trace = bench::MedianTrace(runs);
  }
  r.split_us = Median(st);
  r.write_us = Median(wt);
  r.write_call_us = Median(wct);
  r.host_us = Median(ht);
  // Bytes: each row group reads its sequence's K once; Q and the logits.
  double k_bytes = 0, flops = 0, logit_bytes = 0;
  const int32_t groups_per_seq = (bs.q_len + gpu::kMaxGroupRows - 1) / gpu::kMaxGroupRows;
  // A consumer must read only its pool (cand_topk x cand_block entries of
  // the row's visible ones): its floor and GB/s count those bytes, so the
  // masked walk's whole-context read shows as the gap it is.
  const int64_t scored = bs.kind == BenchKind::kConsumer || bs.kind == BenchKind::kConsumerMasked
                             ? std::min<int64_t>(bs.entries, int64_t{bs.cand_topk} * bs.cand_block)
                             : bs.entries;
  k_bytes = static_cast<double>(bs.batch) * groups_per_seq * scored * layout.entry_bytes();
  for (int32_t n : rows.row_visible) {
    const double m = std::min<double>(n, static_cast<double>(scored));
    flops += 2.0 * m * kHeads * 128;
    logit_bytes += block ? 4.0 * kHeads * ((n + kPage - 1) / kPage) : 4.0 * m;
  }
  const double q_bytes = block ? 4.0 * bqf.size() : static_cast<double>(qv.size() + qs.size() + 4 * w.size());
  const double bytes = k_bytes + logit_bytes + q_bytes;
  r.gbs = bytes / (r.logits_us * 1e-6) / 1e9;
  r.tflops = flops / (r.logits_us * 1e-6) / 1e12;
  r.copy_floor_us = ceil.copy_gbs > 0 ? bytes / (ceil.copy_gbs * 1e9) * 1e6 : 0;
  return r;
}

// --stream-floor: per decode shape (dense or block; prefill re-reads K and
// is left out), StreamKernel over the shape's K bytes, with and without
// writing its logits bytes, with and without the evict-first hint, after
// the bench's flush as measured (dirty) and cleaned (--clean-flush's read
// back); median of `iters` each. Markdown rows like the bench's, in
// microseconds and GB/s of K read.
void RunStreamFloor(const std::vector<BenchShape>& shapes, double copy_gbs, int iters, void* flush,
                    size_t flush_bytes, int num_sms, const std::string& markdown) {
  struct Bytes {
    const BenchShape* shape;
    int64_t k, logits;
  };
  std::vector<Bytes> list;
  int64_t max_k = 0, max_l = 0;
  for (const BenchShape& bs : shapes) {
    const bool block = bs.kind == BenchKind::kBlock;
    if ((bs.kind != BenchKind::kDense && !block) || bs.q_len > 2) continue;
    const PageLayout layout = *PageLayout::Make(bs.format, 128, bs.page);
    const int64_t rows = int64_t{bs.batch} * bs.q_len;
    // Decode: one row group per sequence reads its K once.
    const int64_t k = int64_t{bs.batch} * bs.entries * layout.entry_bytes();
    const int64_t l = block ? rows * bs.heads * ((bs.entries + bs.page - 1) / bs.page) * 4
                            : rows * int64_t{bs.entries} * 4;
    list.push_back({&bs, (k + 15) / 16 * 16, (l + 15) / 16 * 16});
    max_k = std::max(max_k, list.back().k);
    max_l = std::max(max_l, list.back().logits);
  }
  if (list.empty()) {
    std::printf("--stream-floor: no decode shape selected\n");
    return;
  }
  void *src = nullptr, *dst = nullptr;
  CHECK_GPU(gpu::Malloc(&src, static_cast<size_t>(max_k)));
  CHECK_GPU(gpu::Malloc(&dst, static_cast<size_t>(max_l)));
  CHECK_GPU(gpu::MemsetAsync(src, 1, static_cast<size_t>(max_k), nullptr));
  gpu::Event e0, e1;
  CHECK_GPU(gpu::EventCreate(&e0));
  CHECK_GPU(gpu::EventCreate(&e1));
  const int blocks = 4 * num_sms;
  auto time_one = [&](const Bytes& b, bool clean, bool hint, bool write) {
    std::vector<double> t;
    for (int i = 0; i < iters + 2; ++i) {
      FlushL2(flush, flush_bytes, clean, nullptr);
      CHECK_GPU(gpu::EventRecord(e0, nullptr));
      const auto* s = static_cast<const uint4*>(src);
      auto* d = static_cast<uint4*>(dst);
      const int64_t m16 = write ? b.logits / 16 : 0;
      if (hint) StreamKernel<true><<<blocks, 512>>>(s, b.k / 16, d, m16);
      else StreamKernel<false><<<blocks, 512>>>(s, b.k / 16, d, m16);
      CHECK_GPU(gpu::GetLastError());
      CHECK_GPU(gpu::EventRecord(e1, nullptr));
      CHECK_GPU(gpu::StreamSynchronize(nullptr));
      float ms = 0;
      CHECK_GPU(gpu::EventElapsedMs(&ms, e0, e1));
      if (i >= 2) t.push_back(1e3 * ms);
    }
    return Median(t);
  };
  std::string md;
  char line[512];
  std::snprintf(line, sizeof line,
                "Stream floor: a pure streaming kernel (%d blocks x 512 threads, 16-byte loads) reads each "
                "shape's K bytes once and writes its logits bytes, after the bench's flush (1 GiB zeroed: "
                "dirty) or with the flush's lines cleaned first (clean); hint = the L2 evict-first policy on "
                "the loads. Median of %d, us (GB/s of K read; copy %.0f GB/s).\n\n",
                blocks, iters, copy_gbs);
  md += line;
  md += "| shape | K MB | logits MB | dirty hint | dirty | clean hint | clean | dirty hint, no logits | "
        "clean hint, no logits |\n|---|---:|---:|---:|---:|---:|---:|---:|---:|\n";
  for (const Bytes& b : list) {
    const double us[6] = {time_one(b, false, true, true),  time_one(b, false, false, true),
                          time_one(b, true, true, true),   time_one(b, true, false, true),
                          time_one(b, false, true, false), time_one(b, true, true, false)};
    std::string row = "| " + b.shape->name + " | " + std::to_string(b.k >> 20) + " | " +
                      std::to_string(b.logits >> 20);
    for (double u : us) {
      std::snprintf(line, sizeof line, " | %.1f (%.0f)", u, b.k / (u * 1e-6) / 1e9);
      row += line;
    }
    row += " |\n";
    std::printf("%s", row.c_str());
    std::fflush(stdout);
    md += row;
  }
  std::printf("\n%s", md.c_str());
  WriteMarkdown(markdown, md);
  CHECK_GPU(gpu::EventDestroy(e0));
  CHECK_GPU(gpu::EventDestroy(e1));
  CHECK_GPU(gpu::Free(src));
  CHECK_GPU(gpu::Free(dst));
}

// --host: the copies one B=64 decode layer needs, alone: `in_bytes` of Q
// and weights up, `out_bytes` of top-k down, through pinned staging (host
// memcpy + async copy + sync) and straight from pageable memory.
void HostCopyFloor(int64_t in_bytes, int64_t out_bytes, int iters) {
  void *pin_in = nullptr, *pin_out = nullptr, *dev = nullptr;
  CHECK_GPU(gpu::HostMalloc(&pin_in, static_cast<size_t>(in_bytes)));
  CHECK_GPU(gpu::HostMalloc(&pin_out, static_cast<size_t>(out_bytes)));
  CHECK_GPU(gpu::Malloc(&dev, static_cast<size_t>(std::max(in_bytes, out_bytes))));
  std::vector<uint8_t> src(static_cast<size_t>(in_bytes), 1), dst(static_cast<size_t>(out_bytes));
  std::vector<double> t[6];
  using Clock = std::chrono::steady_clock;
  auto us = [](Clock::time_point a, Clock::time_point b) {
    return std::chrono::duration<double, std::micro>(b - a).count();
  };
  for (int i = 0; i < iters + 2; ++i) {
    const auto t0 = Clock::now();
    std::memcpy(pin_in, src.data(), src.size());
    const auto t1 = Clock::now();
    CHECK_GPU(gpu::CopyH2D(dev, pin_in, src.size(), nullptr));
    CHECK_GPU(gpu::StreamSynchronize(nullptr));
    const auto t2 = Clock::now();
    CHECK_GPU(gpu::CopyD2H(pin_out, dev, dst.size(), nullptr));
    CHECK_GPU(gpu::StreamSynchronize(nullptr));
    const auto t3 = Clock::now();
    std::memcpy(dst.data(), pin_out, dst.size());
    const auto t4 = Clock::now();
    CHECK_GPU(gpu::CopyH2D(dev, src.data(), src.size(), nullptr));
    CHECK_GPU(gpu::StreamSynchronize(nullptr));
    const auto t5 = Clock::now();
    CHECK_GPU(gpu::CopyD2H(dst.data(), dev, dst.size(), nullptr));
    CHECK_GPU(gpu::StreamSynchronize(nullptr));
    const auto t6 = Clock::now();
    if (i < 2) continue;
    t[0].push_back(us(t0, t1));
    t[1].push_back(us(t1, t2));
    t[2].push_back(us(t2, t3));
    t[3].push_back(us(t3, t4));
    t[4].push_back(us(t4, t5));
    t[5].push_back(us(t5, t6));
  }
  std::printf("copies alone (%lld B up, %lld B down), medians of %d: pinned: memcpy in %.1f + H2D %.1f + "
              "D2H %.1f + memcpy out %.1f = %.1f us; pageable: H2D %.1f + D2H %.1f = %.1f us\n",
              static_cast<long long>(in_bytes), static_cast<long long>(out_bytes), iters, Median(t[0]),
              Median(t[1]), Median(t[2]), Median(t[3]), Median(t[0]) + Median(t[1]) + Median(t[2]) + Median(t[3]),
              Median(t[4]), Median(t[5]), Median(t[4]) + Median(t[5]));
  CHECK_GPU(gpu::HostFree(pin_in));
  CHECK_GPU(gpu::HostFree(pin_out));
  CHECK_GPU(gpu::Free(dev));
}

// --trace's table: per traced shape, its logits kernel's parts.
std::string TraceTable(const std::vector<Result>& results, int iters) {
  std::string md = absl::StrFormat(
      "\nWhere the logits time goes (--trace; tests/bench/trace_stats.h): medians of %d traced calls (the "
      "split pass: the logits kernel alone between its events). untraced: the table's logits us. outside: "
      "the event time less the blocks' span (first start to last end, %%globaltimer). fill, stream, drain: "
      "a block's start to its first tile ready (first wait: that wait alone), to its last tile scored, to "
      "its end (medians over the blocks, SM cycles at the clock shown). end spread: the last block's end "
      "after the median block's. math waits: the math thread's waits for tiles after the first, %% of "
      "stream; copy waits: the copy warp's waits for free slots, %% of its life (-: not kept).\n\n",
      iters);
  md += "| shape | kernel | untraced us | traced us | outside | span | start spread | fill (first wait) | stream | "
        "drain | end spread | math waits | copy waits | blocks | tiles a block | GHz | timer step ns |\n";
  md += "|---|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|\n";
  for (const Result& r : results) {
    if (!r.traced) continue;
    const bench::TraceStats& t = r.trace;
    if (t.blocks == 0) {
      md += absl::StrFormat("| %s | %s | %.1f | %.1f | no records (the kernel keeps none) |||||||||||||\n",
                            r.shape.name, r.path, r.logits_us, t.event_us);
      continue;
    }
    md += absl::StrFormat(
        "| %s | %s | %.1f | %.1f | %.1f | %.1f | %.1f | %.1f (%.1f) | %.1f | %.1f | %.1f | %.0f %% | %s | %d | %.0f | "
        "%.2f | %.0f |\n",
        r.shape.name, r.path, r.logits_us, t.event_us, t.outside_us, t.span_us, t.start_spread_us, t.fill_us,
        t.first_wait_us, t.stream_us, t.drain_us, t.end_spread_us, t.math_wait_pct,
        t.copy_wait_pct < 0 ? std::string("-") : absl::StrFormat("%.0f %%", t.copy_wait_pct), t.blocks, t.tiles,
        t.clock_ghz, t.timer_step_ns);
  }
  return md;
}

}  // namespace
}  // namespace indexer

int main(int argc, char** argv) {
  using namespace indexer;
  std::string markdown;
  int iters = 30;
  bool quick = false;
  bool clean_flush = false;  // read after the flush so the L2 holds no dirty lines
  bool host = false;         // host wall time of WriteEntries + DenseTopk
  bool sync_flush = false;   // wait for the flush before each timed call
  bool no_ceilings = false;  // skip measuring the ceilings (sweeps of many runs)
  bool stream_floor = false; // the pure streaming kernel per shape instead of the backend
  bool trace = false;        // where each decode shape's logits time goes (per-block records)
  std::string only;  // run only shapes whose name contains one of these (comma-separated)
  for (int i = 1; i < argc; ++i) {
    const std::string a = argv[i];
    if (a == "--markdown" && i + 1 < argc) markdown = argv[++i];
    else if (a == "--iters" && i + 1 < argc) iters = std::atoi(argv[++i]);
    else if (a == "--quick") quick = true;
    else if (a == "--clean-flush") clean_flush = true;
    else if (a == "--sync-flush") sync_flush = true;
    else if (a == "--only" && i + 1 < argc) only = argv[++i];
    else if (a == "--host") host = true;
    else if (a == "--no-ceilings") no_ceilings = true;
    else if (a == "--stream-floor") stream_floor = true;
    else if (a == "--trace") trace = true;
    else {
      std::fprintf(stderr, "usage: %s [--quick] [--clean-flush] [--sync-flush] [--only NAME[,NAME...]] [--iters N] [--markdown FILE] [--host] [--no-ceilings] [--stream-floor] [--trace]\n", argv[0]);
      return 2;
    }
  }
  if (GpuDeviceCount() == 0) {
    std::printf("no GPU: nothing to benchmark\n");
    return 0;
  }
  gpu::DeviceProp prop;
  CHECK_GPU(gpu::GetDeviceProperties(&prop, 0));
  const Ceilings ceil = host || no_ceilings ? Ceilings{} : MeasureCeilings();
  if (!host) {
    std::printf("ceilings: copy %.0f GB/s, mma.sync e4m3 %.0f TFLOP/s, wgmma e4m3 %.0f TFLOP/s\n",
                ceil.copy_gbs, ceil.mma_tflops, ceil.wgmma_tflops);
    std::fflush(stdout);
  }
  const size_t flush_bytes = size_t{1} << 30;
  void* flush = nullptr;
  CHECK_GPU(gpu::Malloc(&flush, flush_bytes));
  const double launch_us =
      host || no_ceilings ? 0.0 : MeasureLaunchFloorUs(flush, flush_bytes, clean_flush, prop.multiProcessorCount);
  if (launch_us > 0) std::printf("ceilings: an empty kernel between the events %.1f us\n", launch_us);

  const KvFormat f8 = KvFormat::kFp8, mx = KvFormat::kMxfp4;
  std::vector<BenchShape> shapes;
  for (int32_t n : {8192, 32768, 131072}) {
    for (int32_t b : {1, 8, 64, 128}) {
      for (int32_t nn : {1, 2}) {
        if (quick && !(n == 32768 || b == 1 || b == 128)) continue;
        // Issue 11's targets (H200 figures: 0.9x DeepGEMM + FlashInfer's
        // layer measured beside them, PEERS.md).
        std::string target;
        if (b == 64 && n == 8192 && nn == 1) target = "layer <= 38 (H200)";
        if (b == 64 && n == 32768 && nn == 1) target = "layer <= 95 (H200)";
        if (b == 64 && n == 32768 && nn == 2) target = "layer <= 1.1x next_n=1";
        if (b == 128 && n == 32768 && nn == 1) target = "layer <= 157 (H200)";
        if (b == 128 && n == 131072 && nn == 1) target = "layer <= 593 (H200)";
        if (b == 1 && n == 131072 && nn == 1) target = "layer <= 30";
        shapes.push_back({"decode fp8 B=" + std::to_string(b) + " next_n=" + std::to_string(nn) +
                              " n=" + std::to_string(n / 1024) + "k",
                          f8, b, nn, n, 2048, target});
      }
    }
  }
  shapes.push_back({"decode fp8 B=64 next_n=1 n=32k (mma.sync)", f8, 64, 1, 32768, 2048, "", 1});
  shapes.push_back({"decode fp8 B=64 next_n=2 n=32k (mma.sync)", f8, 64, 2, 32768, 2048, "", 1});
  shapes.push_back({"decode mxfp4 B=64 next_n=1 n=32k", mx, 64, 1, 32768, 2048, "layer <= 0.6x fp8"});
  shapes.push_back({"decode mxfp4 B=64 next_n=2 n=32k", mx, 64, 2, 32768, 2048, ""});
  shapes.push_back({"decode mxfp4 B=64 next_n=1 n=32k (mma.sync)", mx, 64, 1, 32768, 2048, "", 1});
  shapes.push_back({"decode mxfp4 B=1 next_n=1 n=128k", mx, 1, 1, 131072, 2048, ""});
  shapes.push_back({"decode mxfp4 B=128 next_n=1 n=128k", mx, 128, 1, 131072, 2048, ""});
  shapes.push_back({"prefill fp8 4k rows n=32k", f8, 1, 4096, 32768, 2048, ">= 1000 TFLOP/s"});
  shapes.push_back({"prefill mxfp4 4k rows n=32k", mx, 1, 4096, 32768, 2048, ""});
  if (!quick) shapes.push_back({"prefill fp8 16k rows n=32k", f8, 1, 16384, 32768, 2048, ""});
  // Index heads 32 and 16 on the dense path (the tensor-core kernels take H
  // as a template constant); the (portable) and (mma.sync) rows are the
  // paths H = 32 ran before and the fallback.
  for (int32_t h : {32, 16}) {
    const std::string hs = "H=" + std::to_string(h) + " ";
    shapes.push_back({"decode fp8 " + hs + "B=64 next_n=1 n=32k", f8, 64, 1, 32768, 2048, "", 2, h});
    shapes.push_back({"decode fp8 " + hs + "B=128 next_n=1 n=128k", f8, 128, 1, 131072, 2048, "", 2, h});
    shapes.push_back({"decode mxfp4 " + hs + "B=64 next_n=1 n=32k", mx, 64, 1, 32768, 2048, "", 2, h});
  }
  shapes.push_back({"decode fp8 H=32 B=64 next_n=2 n=32k", f8, 64, 2, 32768, 2048, "", 2, 32});
  shapes.push_back({"decode fp8 H=32 B=64 next_n=1 n=32k (mma.sync)", f8, 64, 1, 32768, 2048, "", 1, 32});
  shapes.push_back({"decode fp8 H=32 B=64 next_n=1 n=32k (portable)", f8, 64, 1, 32768, 2048, "", 0, 32});
  shapes.push_back({"decode mxfp4 H=32 B=64 next_n=1 n=32k (portable)", mx, 64, 1, 32768, 2048, "", 0, 32});
  // DeepSeek-V4.1 (H 32, r 4, top 512; pools of 2048 blocks of 8 entries):
  // dense, the candidate source and a consumer at 32k and 128k visible
  // entries. The consumer's floor counts its pool's bytes only.
  for (int32_t n : {32768, 131072}) {
    for (int32_t b : {8, 64}) {
      if (quick && b != 64) continue;
      const std::string tail = " H=32 r=4 top=512 B=" + std::to_string(b) + " n=" + std::to_string(n / 1024) + "k";
      std::string cons_target;
      if (n == 131072 && b == 64) cons_target = "layer <= 0.25x dense";
      for (KvFormat f : {f8, mx}) {
        if (f == mx && (quick || b != 64)) continue;
        const std::string fs = f == f8 ? "fp8" : "mxfp4";
        shapes.push_back({"v4.1 dense " + fs + tail, f, b, 1, n, 512, "", 2, 32, 4, BenchKind::kDense});
        shapes.push_back({"v4.1 source " + fs + tail, f, b, 1, n, 512, "", 2, 32, 4, BenchKind::kSource});
        shapes.push_back({"v4.1 consumer " + fs + tail + " pool=2048x8", f, b, 1, n, 512, cons_target, 2, 32, 4,
                          BenchKind::kConsumer});
        if (b == 64) {
          shapes.push_back({"v4.1 consumer " + fs + tail + " pool=2048x8 (masked walk)", f, b, 1, n, 512, "", 2, 32,
                            4, BenchKind::kConsumerMasked});
        }
      }
    }
  }
  // MiniMax-M3 block path: Hi 4, MXFP4 pages of 128 entries (a block), top
  // 16 blocks, the newest forced in; decode B 1/64/128 at 32k and 128k, and
  // a 4k-row prefill chunk.
  for (int32_t n : {32768, 131072}) {
    for (int32_t b : {1, 64, 128}) {
      if (quick && b == 1) continue;
      shapes.push_back({"minimax block mxfp4 Hi=4 top=16 B=" + std::to_string(b) + " n=" + std::to_string(n / 1024) +
                            "k",
                        mx, b, 1, n, 16, b == 64 && n == 32768 ? ">= 70 % of copy" : "", 2, 4, 1,
                        BenchKind::kBlock, 128});
    }
  }
  // The mma.sync kernel of before the streaming one, for same-call figures.
  shapes.push_back({"minimax block mxfp4 Hi=4 top=16 B=64 n=32k (block_mma)", mx, 64, 1, 32768, 16, "", 1, 4, 1,
                    BenchKind::kBlock, 128});
  if (!quick) {
    shapes.push_back({"minimax block mxfp4 Hi=4 top=16 prefill 4k rows n=32k", mx, 1, 4096, 32768, 16, "", 2, 4, 1,
                      BenchKind::kBlock, 128});
  }

  // --only: comma-separated substrings; the shapes matching any of them.
  std::vector<BenchShape> selected;
  for (const BenchShape& bs : shapes) {
    if (host && only.empty() && bs.name != "decode fp8 B=64 next_n=1 n=32k") continue;
    bool hit = only.empty();
    for (size_t a = 0; a <= only.size();) {
      const size_t b = std::min(only.find(',', a), only.size());
      if (b > a && bs.name.find(only.substr(a, b - a)) != std::string::npos) hit = true;
      a = b + 1;
    }
    if (hit) selected.push_back(bs);
  }
  if (stream_floor) {
    RunStreamFloor(selected, ceil.copy_gbs, iters, flush, flush_bytes, prop.multiProcessorCount, markdown);
    CHECK_GPU(gpu::Free(flush));
    return 0;
  }
  std::vector<Result> results;
  for (const BenchShape& bs : selected) {
    results.push_back(RunShape(bs, ceil, iters, flush, flush_bytes, clean_flush, host, sync_flush, trace));
    const Result& r = results.back();
    if (host) {
      const double kernels = r.write_us + r.logits_us + r.topk_us;
      std::printf("%-44s host: WriteEntries %7.1f us (kernel %5.1f)  DenseTopk %7.1f us (kernels %6.1f)  "
                  "both %7.1f us, kernels %6.1f us, overhead %6.1f us  (medians of %d)\n",
                  bs.name.c_str(), r.write_call_us, r.write_us, r.call_us, r.layer_us, r.host_us, kernels,
                  r.host_us - kernels, iters);
      std::fflush(stdout);
      continue;
    }
    std::printf("%-44s %-8s logits %9.1f us  %7.0f GB/s  %6.1f TFLOP/s  floor %8.1f us  topk %8.1f us  layer %9.1f us  "
                "split %9.1f us  call %9.1f us\n",
                bs.name.c_str(), r.path.c_str(), r.logits_us, r.gbs, r.tflops, r.copy_floor_us, r.topk_us, r.layer_us,
                r.split_us, r.call_us);
    std::fflush(stdout);
  }

  if (host) {
    HostCopyFloor(64 * 64 * (128 + 4), 64 * 2048 * 4, iters);
    CHECK_GPU(gpu::Free(flush));
    return 0;
  }
  std::string md;
  char line[1536];
  const std::string launch_note =
      launch_us > 0 ? absl::StrFormat("; an empty kernel between the events %.1f us (each logits and top-k "
                                      "span holds one launch)", launch_us)
                    : std::string();
  std::snprintf(line, sizeof line,
                "Device: %s, %d SMs. Ceilings measured here: copy %.0f GB/s (device-to-device, read + write); "
                "mma.sync m16n8k32 e4m3 %.0f TFLOP/s; wgmma m64n256k32 e4m3 %.0f TFLOP/s; "
                "datasheet dense FP8 (wgmma) %.0f TFLOP/s%s.\n"
                "Method: L2 flushed (1 GiB zeroed) before each call%s, backend CUDA events around the "
                "logits and top-k kernels of one call (DenseTopk, CandidateSource, CandidateConsumer or "
                "BlockTopk), median of %d; H = 64, D = 128, page 64 entries, top-k 2048, r = 1 unless "
                "the shape's name says otherwise; random block tables. logits, top-k: each kernel timed "
                "alone, an event between them (a source's pool selection and a masked consumer's "
                "compaction count as top-k); split = their sum (the method of PEERS.md's table); layer = the "
                "same kernels as the backend times them by default, one span from the logits kernel's "
                "start over the first top-k side kernel (no event between: set_split_timing); "
                "call = host wall time of the call (Q upload, kernels, output download), the "
                "flush waited for. floor = the bytes the layer must read (K of the entries it scores: "
                "a consumer's pool only; Q, weights, logits) at the measured copy bandwidth.\n\n",
                prop.name, prop.multiProcessorCount, ceil.copy_gbs, ceil.mma_tflops, ceil.wgmma_tflops,
                kDatasheetFp8Tflops, launch_note.c_str(),
                sync_flush ? " and waited for (--sync-flush: host launch gaps count)"
                           : " and not waited for (the call queued behind it)",
                iters);
  md += line;
  md += "| shape | kernel | logits us | floor us | GB/s (% copy) | TFLOP/s (% mma.sync, % wgmma measured) | top-k us | layer us | call us | target | split us |\n";
  md += "|---|---|---:|---:|---:|---:|---:|---:|---:|---|---:|\n";
  for (const Result& r : results) {
    std::snprintf(line, sizeof line, "| %s | %s | %.1f | %.1f | %.0f (%.0f%%) | %.1f (%.0f%%, %.0f%%) | %.1f | %.1f | %.1f | %s | %.1f |\n",
                  r.shape.name.c_str(), r.path.c_str(), r.logits_us, r.copy_floor_us, r.gbs, 100 * r.gbs / ceil.copy_gbs,
                  r.tflops, ceil.mma_tflops > 0 ? 100 * r.tflops / ceil.mma_tflops : 0.0,
                  ceil.wgmma_tflops > 0 ? 100 * r.tflops / ceil.wgmma_tflops : 0.0, r.topk_us, r.layer_us, r.call_us,
                  r.shape.target.c_str(), r.split_us);
    md += line;
  }
  if (trace) md += TraceTable(results, iters);
  std::printf("\n%s", md.c_str());
  if (!WriteMarkdown(markdown, md)) return 1;
  CHECK_GPU(gpu::Free(flush));
  return 0;
}

// The gpu backend's other paths against float64 references on the same
// inputs as the cpu backend: the tensor-core logits at H = 32 and 16 on odd
// sizes, the candidate source and consumer (its gather and masked walks
// alike) and the MiniMax block path (tensor-core and portable scores).
// Part of the gpu_backend_test binary; skips without a GPU.
#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <memory>
#include <numeric>
#include <random>
#include <string>
#include <vector>

#include "gtest/gtest.h"
#include "kernels/backend.h"
#include "kernels/format/mxfp4.h"
#include "kernels/gpu/gpu_backend.h"
#include "kernels/gpu/gpu_backend_impl.h"
#include "kernels/gpu/gpu_compat.h"
#include "kernels/gpu/plan.h"
#include "tests/gpu/gpu_test_pair.h"
#include "tests/gpu/gpu_test_reference.h"

namespace indexer {
namespace gpu_test {
namespace {

// H = 32 and 16 on the tensor-core kernels at odd sizes: rows of one entry,
// of a page and of a page + 1, short rows under the top-k, next_n 2 and a
// long row, each against the float64 reference; on an sm_90 device the
// kernel that ran is the tensor-core one the layout allows (not portable).
struct NarrowCase {
  KvFormat format;
  bool tiled;
  int32_t heads;
  int max_path;
};

class GpuNarrowHeadsTest : public ::testing::TestWithParam<NarrowCase> {};

TEST_P(GpuNarrowHeadsTest, OddSizesMatchReference) {
  SKIP_WITHOUT_GPU();
  const NarrowCase c = GetParam();
  // Tiled: the gfx942 preshuffle (16 entries x 16 bytes), as GpuDenseTest.
  const PageLayout layout =
      c.tiled ? *PageLayout::Make(c.format, 128, 64, 16, 16, c.format == KvFormat::kMxfp4 ? 2 : 1)
              : *PageLayout::Make(c.format, 128, 64);
  std::mt19937 rng(31 + c.heads + c.max_path);
  const std::vector<int32_t> hist = {0, 1, 63, 64, 65, 127, 129, 4000, 30};
  const std::vector<int32_t> q_lens = {1, 1, 1, 1, 1, 2, 2, 1, 2};
  Scenario sc = MakeScenario(rng, layout, hist, q_lens);
  ExpectPoolsEqual(sc.p, layout);
  const StepRows& rows = sc.rows;
  auto* backend = static_cast<gpu::GpuBackend*>(sc.p.gpu.get());
  backend->set_max_logits_path(c.max_path);
  const int32_t topk = 64;
  const QData q = MakeQ(rng, layout, rows.num_rows, c.heads);
  std::vector<int32_t> got(static_cast<size_t>(rows.num_rows) * topk, -7);
  auto t = sc.p.gpu->DenseTopk(layout, sc.p.gpu_pool, rows, sc.gpu_ctx.get(), q.input, topk, got.data());
  ASSERT_TRUE(t.ok()) << t.status();
  const std::string path = backend->last_logits_path();
  std::printf("[   path   ] logits kernel: %s\n", path.c_str());
  gpu::DeviceProp prop;
  ASSERT_EQ(gpu::GetDeviceProperties(&prop, 0), gpu::kSuccess);
  if (prop.major == 9 && prop.minor == 0 && std::getenv("INDEXER_GPU_WGMMA_WS") == nullptr &&
      std::getenv("INDEXER_GPU_WGMMA_MXFP4") == nullptr) {
    const char* want = c.max_path == 1 ? "mma"
                       : c.format == KvFormat::kFp8 ? (c.tiled ? "wgmma" : "wgmma_ws")
                                                    : (c.tiled ? "mma" : "wgmma_mxfp4");
    EXPECT_EQ(path, want);
  }
  const PathTolerance tol = ToleranceFor(path, c.format);
  Margin m;
  for (int32_t r = 0; r < rows.num_rows; ++r) {
    const int32_t n = rows.row_visible[r];
    const RefRow ref = RefLogits(sc.p, layout, rows, q, r);
    ExpectTopkRow(got.data() + static_cast<int64_t>(r) * topk, n, topk, ref.logit, ref.Tol(tol),
                  "gpu (" + path + ") row " + std::to_string(r) + " n " + std::to_string(n), &m);
    if (HasFatalFailure()) return;
  }
  m.Print(path);
}

INSTANTIATE_TEST_SUITE_P(
    Heads, GpuNarrowHeadsTest,
    ::testing::Values(NarrowCase{KvFormat::kFp8, false, 32, 2}, NarrowCase{KvFormat::kFp8, false, 16, 2},
                      NarrowCase{KvFormat::kFp8, true, 32, 2}, NarrowCase{KvFormat::kFp8, true, 16, 2},
                      NarrowCase{KvFormat::kFp8, false, 32, 1}, NarrowCase{KvFormat::kMxfp4, false, 32, 2},
                      NarrowCase{KvFormat::kMxfp4, false, 16, 2}, NarrowCase{KvFormat::kMxfp4, true, 32, 2},
                      NarrowCase{KvFormat::kMxfp4, false, 16, 1}),
    [](const auto& info) {
      const NarrowCase& c = info.param;
      return std::string(c.format == KvFormat::kFp8 ? "fp8" : "mxfp4") + (c.tiled ? "_tiled" : "") + "_H" +
             std::to_string(c.heads) + (c.max_path == 1 ? "_mma" : "");
    });

struct CandCase {
  KvFormat format;
  int32_t page_entries;
  int32_t block_size;
  int32_t topk_blocks;
  int32_t topk;
  bool pin;
  std::vector<int32_t> hist;
  std::vector<int32_t> q_lens;
  int32_t heads = 64;
  int max_path = 2;  // logits path cap (gpu_backend_test's Shape::max_path)
};

class GpuCandidateTest : public ::testing::TestWithParam<CandCase> {};

// Source and consumer on the gpu against a float64 reference, every row,
// each under its logits path's tolerance: the source's own output by the
// dense rule, the consumer's by ConsumerRowViolation (gpu_test_reference.h:
// the SPEC §5 set check over the pool, known up to blocks at its cut).
TEST_P(GpuCandidateTest, SourceAndConsumerMatchReference) {
  SKIP_WITHOUT_GPU();
  const CandCase c = GetParam();
  const PageLayout layout = *PageLayout::Make(c.format, 128, c.page_entries);
  std::mt19937 rng(99 + c.block_size * 13 + c.topk_blocks);
  Scenario sc = MakeScenario(rng, layout, c.hist, c.q_lens);
  const StepRows& rows = sc.rows;
  CandidateSpec spec;
  spec.block_size = c.block_size;
  spec.topk_blocks = c.topk_blocks;
  spec.pin_newest = c.pin;
  const QData qs = MakeQ(rng, layout, rows.num_rows, c.heads);
  const QData qc = MakeQ(rng, layout, rows.num_rows, c.heads);
  const int64_t k = c.topk;
  std::vector<int32_t> src(rows.num_rows * k), got(rows.num_rows * k, -7);
  auto* backend = static_cast<gpu::GpuBackend*>(sc.p.gpu.get());
  backend->set_max_logits_path(c.max_path);

  // A consumer before its source: FAILED_PRECONDITION.
  EXPECT_EQ(sc.p.gpu->CandidateConsumer(layout, sc.p.gpu_pool, rows, sc.gpu_ctx.get(), qc.input, c.topk,
                                        spec, ConsumerMode::kAuto, got.data()).status().code(),
            absl::StatusCode::kFailedPrecondition);
  auto ts = sc.p.gpu->CandidateSource(layout, sc.p.gpu_pool, rows, sc.gpu_ctx.get(), qs.input, c.topk,
                                      spec, src.data());
  ASSERT_TRUE(ts.ok()) << ts.status();
  const std::string src_path = backend->last_logits_path();
  auto tc = sc.p.gpu->CandidateConsumer(layout, sc.p.gpu_pool, rows, sc.gpu_ctx.get(), qc.input, c.topk,
                                        spec, ConsumerMode::kAuto, got.data());
  ASSERT_TRUE(tc.ok()) << tc.status();
  const std::string cons_path = backend->last_logits_path();
  std::printf("[   path   ] logits kernels: source %s, consumer %s\n", src_path.c_str(), cons_path.c_str());
  ExpectMfmaPath(c.max_path, c.format, src_path);
  if (!cons_path.empty()) ExpectMfmaPath(c.max_path, c.format, cons_path);
  const PathTolerance src_t = ToleranceFor(src_path, c.format), cons_t = ToleranceFor(cons_path, c.format);

  int32_t borderline_rows = 0;
  Margin src_m, cons_m;
  for (int32_t r = 0; r < rows.num_rows; ++r) {
    const int32_t n = rows.row_visible[r];
    const std::string what = "row " + std::to_string(r) + " n " + std::to_string(n);
    const RefRow src_ref = RefLogits(sc.p, layout, rows, qs, r);
    const std::vector<double> tol = src_ref.Tol(src_t);
    ExpectTopkRow(src.data() + r * k, n, c.topk, src_ref.logit, tol, "source " + what, &src_m);
    if (HasFatalFailure()) return;
    const RefRow cons_ref = RefLogits(sc.p, layout, rows, qc, r);
    bool borderline = false;
    double used = 0;
    ASSERT_EQ(ConsumerRowViolation(got.data() + r * k, n, c.topk, spec, src_ref.logit, tol, cons_ref.logit,
                                   cons_ref.Tol(cons_t), &borderline, &used),
              "")
        << "consumer " << what;
    borderline_rows += borderline;
    cons_m.Add(used, "consumer " + what);
  }
  std::printf("[   pools  ] %d rows, %d with borderline blocks\n", rows.num_rows, borderline_rows);
  src_m.Print("source " + src_path);
  cons_m.Print("consumer " + cons_path);

  // The gather walk (the pool's slots only) and the masked walk return the
  // same rows (SPEC §5: the length gate is never visible in results); on an
  // sm_90 device FP8 consumers gather when asked to, and so do MXFP4 ones
  // on linear pages of a multiple of 64 entries with pool blocks of a
  // multiple of 8 entries (others walk masked even when asked to gather).
  std::vector<int32_t> masked(got.size(), -7), gathered(got.size(), -7);
  auto tm = sc.p.gpu->CandidateConsumer(layout, sc.p.gpu_pool, rows, sc.gpu_ctx.get(), qc.input, c.topk, spec,
                                        ConsumerMode::kMasked, masked.data());
  ASSERT_TRUE(tm.ok()) << tm.status();
  const std::string masked_path = backend->last_logits_path();
  auto tg = sc.p.gpu->CandidateConsumer(layout, sc.p.gpu_pool, rows, sc.gpu_ctx.get(), qc.input, c.topk, spec,
                                        ConsumerMode::kGather, gathered.data());
  ASSERT_TRUE(tg.ok()) << tg.status();
  const std::string gather_path = backend->last_logits_path();
  std::printf("[   path   ] consumer masked %s, gather %s\n", masked_path.c_str(), gather_path.c_str());
  EXPECT_EQ(masked_path.find("gather"), std::string::npos);
  gpu::DeviceProp prop;
  ASSERT_EQ(gpu::GetDeviceProperties(&prop, 0), gpu::kSuccess);
  // (The MFMA requests, max_path 3 and 4, walk masked: gather runs on wgmma.)
  // Pages of a multiple of 64 entries (the pool's tensor maps) and pool
  // blocks of a multiple of 8 entries take the warp-specialized kernel,
  // other pools the serial one (as does INDEXER_GPU_WGMMA_WS=0).
  if (prop.major == 9 && prop.minor == 0 && c.format == KvFormat::kFp8 && c.max_path == 2) {
    const bool ws = c.page_entries % 64 == 0 && c.block_size % 8 == 0 &&
                    std::getenv("INDEXER_GPU_WGMMA_WS") == nullptr;
    EXPECT_EQ(gather_path, ws ? "wgmma_ws_gather" : "wgmma_gather");
  }
  if (prop.major == 9 && prop.minor == 0 && c.format == KvFormat::kMxfp4 && c.max_path == 2 &&
      std::getenv("INDEXER_GPU_WGMMA_MXFP4") == nullptr) {
    const bool mx_gather = c.page_entries % 64 == 0 && c.block_size % 8 == 0;
    EXPECT_EQ(gather_path, mx_gather ? "wgmma_mxfp4_gather" : masked_path);
    // The length gate's own choice: gather where the widest row sees more
    // than gate_ratio x the pool's entries.
    const int32_t widest = *std::max_element(rows.row_visible.begin(), rows.row_visible.end());
    if (mx_gather && widest > std::max<int64_t>(spec.gate_ratio, 1) * int64_t{c.block_size} * c.topk_blocks) {
      EXPECT_EQ(cons_path, "wgmma_mxfp4_gather");
    }
  }
  for (int32_t r = 0; r < rows.num_rows; ++r) {
    std::vector<int32_t> a(masked.begin() + r * k, masked.begin() + (r + 1) * k);
    std::vector<int32_t> b(gathered.begin() + r * k, gathered.begin() + (r + 1) * k);
    std::vector<int32_t> d(got.begin() + r * k, got.begin() + (r + 1) * k);
    std::sort(a.begin(), a.end());
    std::sort(b.begin(), b.end());
    std::sort(d.begin(), d.end());
    ASSERT_EQ(a, b) << "row " << r << ": gather and masked walks differ";
    ASSERT_EQ(a, d) << "row " << r << ": the length gate's choice differs from the masked walk";
  }
}

INSTANTIATE_TEST_SUITE_P(
    Cases, GpuCandidateTest,
    ::testing::Values(
        // decode, pools a real subset, the newest pinned
        CandCase{KvFormat::kFp8, 64, 8, 64, 256, true, {3000, 1200, 9000, 40}, {1, 1, 1, 1}},
        // next_n 2, MXFP4, no pin, odd block size
        CandCase{KvFormat::kMxfp4, 16, 3, 50, 64, false, {700, 2000, 31}, {2, 2, 2}},
        // whole pools (<= topk entries) mixed with real ones; prefill rows
        CandCase{KvFormat::kFp8, 16, 4, 16, 128, true, {100, 5000, 0}, {1, 3, 40}},
        // a long row through the cooperative top-k, 2048 blocks of 8
        CandCase{KvFormat::kFp8, 64, 8, 2048, 2048, true, {60000}, {1}},
        // V4.1's geometry at H = 32 (tensor-core logits): blocks of 8, top
        // 512, pools of 128 blocks; one entry, a page + 1, next_n 2, and
        // pools smaller than the top-k (48 blocks = 384 entries)
        CandCase{KvFormat::kFp8, 64, 8, 128, 512, true, {20000, 0, 64, 3000}, {1, 1, 1, 2}, 32},
        CandCase{KvFormat::kFp8, 64, 8, 48, 512, true, {9000, 300, 64}, {2, 2, 1}, 32},
        CandCase{KvFormat::kMxfp4, 64, 8, 128, 512, true, {20000, 0, 1000}, {1, 1, 2}, 32},
        CandCase{KvFormat::kFp8, 64, 8, 64, 256, true, {3000, 1200, 9000, 40}, {1, 1, 1, 1}, 16},
        // the first four through the MFMA kernels (FP8 as gfx942, MXFP4 as gfx950)
        CandCase{KvFormat::kFp8, 64, 8, 64, 256, true, {3000, 1200, 9000, 40}, {1, 1, 1, 1}, 64,
                 gpu::kPathMfmaGfx942},
        CandCase{KvFormat::kMxfp4, 16, 3, 50, 64, false, {700, 2000, 31}, {2, 2, 2}, 64,
                 gpu::kPathMfmaGfx950},
        CandCase{KvFormat::kFp8, 16, 4, 16, 128, true, {100, 5000, 0}, {1, 3, 40}, 64,
                 gpu::kPathMfmaGfx950},
        CandCase{KvFormat::kFp8, 64, 8, 2048, 2048, true, {60000}, {1}, 64, gpu::kPathMfmaGfx942},
        // The gather walk's odd sizes (c12-c16): a one-block pool (8
        // entries, under the top-k) beside a row of one entry, a page + 1
        // and a partly visible last block; pools of 40 blocks (under the
        // top-k) with partly visible last blocks, a page + 1 and next_n 2;
        // blocks of 16 (two 8-entry chunks each) over many rows of mixed
        // lengths (units and copy windows across rows); blocks of 64 (a
        // whole tile) on pages of 128 at H 64; blocks of 12 (the serial
        // kernel: not whole 8-entry chunks) at H 16.
        CandCase{KvFormat::kFp8, 64, 8, 1, 512, true, {9001, 0, 64}, {1, 1, 1}, 32},
        CandCase{KvFormat::kFp8, 64, 8, 40, 512, true, {1000, 64, 8195, 129}, {1, 1, 2, 1}, 32},
        CandCase{KvFormat::kFp8, 64, 16, 96, 512, true, {5000, 7, 20000, 3001, 64, 12000, 900, 30000},
                 {1, 1, 1, 1, 1, 2, 1, 1}, 32},
        CandCase{KvFormat::kFp8, 128, 64, 24, 256, false, {10000, 3000, 100}, {1, 1, 1}, 64},
        CandCase{KvFormat::kFp8, 64, 12, 40, 128, true, {4000, 70}, {1, 1}, 16},
        // The MXFP4 gather walk (c17-c22; c6 above gathers too): c12-c16's
        // odd sizes on MXFP4 pages (c21, blocks of 12, walks masked even
        // when asked to gather), and H 16 on c7's pools.
        CandCase{KvFormat::kMxfp4, 64, 8, 1, 512, true, {9001, 0, 64}, {1, 1, 1}, 32},
        CandCase{KvFormat::kMxfp4, 64, 8, 40, 512, true, {1000, 64, 8195, 129}, {1, 1, 2, 1}, 32},
        CandCase{KvFormat::kMxfp4, 64, 16, 96, 512, true, {5000, 7, 20000, 3001, 64, 12000, 900, 30000},
                 {1, 1, 1, 1, 1, 2, 1, 1}, 32},
        CandCase{KvFormat::kMxfp4, 128, 64, 24, 256, false, {10000, 3000, 100}, {1, 1, 1}, 64},
        CandCase{KvFormat::kMxfp4, 64, 12, 40, 128, true, {4000, 70}, {1, 1}, 16},
        CandCase{KvFormat::kMxfp4, 64, 8, 64, 256, true, {3000, 1200, 9000, 40}, {1, 1, 1, 1}, 16}),
    [](const auto& info) { return "c" + std::to_string(info.index) + PathSuffix(info.param.max_path); });

// The block path on the gpu against a float64 reference of the block scores
// (sentinels included): count, range, distinctness, -1 fill, and every
// chosen block scores at least the reference's k-th. The three kernels:
// the streaming one (max path 2 on sm_90: persistent CTAs over the step's
// work map, bulk page copies, mma.sync fp16), the mma.sync one (1; 2 off
// sm_90) and the portable one (0); odd sizes: rows of one entry, of a page
// + 1, fewer causal blocks than the top-k, Hi 5 and 8 (two column tiles),
// Hi 9 (portable), tiled pages, many rows of mixed lengths, a row over
// more blocks than the block top-k takes; heads of very different sizes
// (the streaming kernel scales Q by one exponent per row and block, over
// every head).
TEST(GpuBlockTest, BlockTopkMatchesReference) {
  SKIP_WITHOUT_GPU();
  struct Case {
    int32_t page_entries, heads, topk, init, local;
    std::vector<int32_t> hist, q_lens;
    bool tiled = false;
    int head_spread = 0;  // head h's Q times 2^(-head_spread * h)
  };
  const std::vector<Case> cases = {
      {128, 4, 16, 0, 1, {5000, 300, 20000}, {1, 1, 1}},
      {32, 1, 4, 1, 2, {900, 100}, {2, 3}},
      {16, 4, 6, 2, 1, {0, 2000}, {40, 1}},
      {128, 4, 16, 0, 1, {0, 128, 127, 1000, 3000}, {1, 1, 2, 1, 1}},
      {128, 5, 8, 1, 1, {4000, 129}, {1, 2}},
      {64, 8, 5, 0, 0, {3000, 70}, {1, 1}},
      {64, 9, 5, 0, 1, {2000}, {2}},
      {64, 4, 6, 0, 1, {2500, 64}, {1, 1}, true},
      // the streaming kernel's work map: 23 rows of mixed lengths (rows
      // that cross CTA ranges, one-entry rows, next_n 2), a long row over
      // many CTAs, Hi 8 on full pages
      {128, 4, 16, 1, 2, {0, 5000, 127, 128, 129, 300, 9000, 1, 70, 4000, 255, 256, 2000, 30000, 15,
                          640, 1100, 3, 7000, 500, 12000, 64, 900},
       {1, 1, 1, 1, 2, 1, 1, 1, 1, 2, 1, 1, 1, 1, 1, 1, 1, 2, 1, 1, 1, 1, 1}},
      {64, 1, 16, 0, 1, {60000}, {1}},
      {128, 8, 16, 2, 1, {9000, 300}, {2, 1}},
      // more blocks than the block top-k takes (1250 > 1024): the general top-k
      {16, 4, 6, 2, 1, {20000}, {1}},
      // the general top-k over every head at once (rows of 83-469 blocks,
      // next_n 2): head h's rows follow head h - 1's in one launch
      {64, 4, 16, 1, 1, {30000, 20000, 5300}, {1, 2, 1}},
      // heads 2^5 apart (head 3: 2^-15 of head 0), 2^7 apart (head 3 at
      // 2^-21: past the range where its fp16 lo part stays normal), and
      // Hi 8 2^3 apart
      {128, 4, 16, 0, 1, {20000, 3000, 129}, {1, 2, 1}, false, 5},
      {128, 4, 16, 0, 1, {6000, 130}, {1, 1}, false, 7},
      {128, 8, 16, 1, 1, {9000, 4100}, {1, 1}, false, 3},
  };
  for (const Case& c : cases) {
    for (int max_path : {2, 1, 0}) {
      const PageLayout layout = c.tiled ? *PageLayout::Make(KvFormat::kMxfp4, 128, c.page_entries, 16, 16, 2)
                                        : *PageLayout::Make(KvFormat::kMxfp4, 128, c.page_entries);
      std::mt19937 rng(5 + c.page_entries + c.heads);
      Scenario sc = MakeScenario(rng, layout, c.hist, c.q_lens);
      static_cast<gpu::GpuBackend*>(sc.p.gpu.get())->set_max_logits_path(max_path);
      const StepRows& rows = sc.rows;
      std::normal_distribution<float> nd(0.f, 1.f);
      std::vector<float> q(static_cast<size_t>(rows.num_rows) * c.heads * 128);
      for (size_t i = 0; i < q.size(); ++i) {
        const int h = static_cast<int>(i / 128 % c.heads);
        q[i] = std::ldexp(nd(rng), -c.head_spread * h);
      }
      BlockQInput bq;
      bq.num_heads = c.heads;
      bq.q = q.data();
      BlockSpec spec;
      spec.topk_blocks = c.topk;
      spec.init_blocks = c.init;
      spec.local_blocks = c.local;
      std::vector<int32_t> got(static_cast<size_t>(c.heads) * rows.num_rows * c.topk, -7);
      auto t = sc.p.gpu->BlockTopk(layout, sc.p.gpu_pool, rows, sc.gpu_ctx.get(), bq, spec, got.data());
      ASSERT_TRUE(t.ok()) << t.status();
      const std::string path = static_cast<gpu::GpuBackend*>(sc.p.gpu.get())->last_logits_path();
      std::printf("[   path   ] block scores: %s (Hi %d, E %d)\n", path.c_str(), c.heads, c.page_entries);
      gpu::DeviceProp prop;
      ASSERT_EQ(gpu::GetDeviceProperties(&prop, 0), gpu::kSuccess);
      if (prop.major * 10 + prop.minor >= 89) {
        const bool stream = prop.major == 9 && max_path >= 2 && c.page_entries % 16 == 0;
        EXPECT_EQ(path, c.heads > 8 || max_path == 0 ? "block_portable"
                        : stream                     ? "block_stream"
                                                     : "block_mma");
      }
      std::vector<uint8_t> entry(layout.entry_bytes());
      for (int32_t r = 0; r < rows.num_rows; ++r) {
        const int32_t n = rows.row_visible[r], s = rows.row_seq[r], pe = c.page_entries;
        const int32_t causal = static_cast<int32_t>(PagesFor(n, pe));
        std::vector<std::vector<double>> kd(n, std::vector<double>(128));
        for (int32_t e = 0; e < n; ++e) {
          ASSERT_TRUE(sc.p.cpu->ReadEntries(layout, sc.p.cpu_pool, rows.Page(s, e / pe), e % pe, 1,
                                            entry.data()).ok());
          for (int32_t d = 0; d < 128; ++d) kd[e][d] = Mxfp4Element(entry.data(), entry.data() + 64, d);
        }
        for (int32_t h = 0; h < c.heads; ++h) {
          const float* qh = q.data() + (static_cast<int64_t>(r) * c.heads + h) * 128;
          std::vector<double> score(causal, -INFINITY), tol(causal, 0);
          for (int32_t e = 0; e < n; ++e) {
            double dot = 0, mag = 0;
            for (int32_t d = 0; d < 128; ++d) {
              dot += qh[d] * kd[e][d];
              mag += std::fabs(qh[d] * kd[e][d]);
            }
            dot *= spec.scale;
            score[e / pe] = std::max(score[e / pe], dot);
            // The kernel's block maximum may come from another entry of the
            // block: the largest of their bounds covers it.
            tol[e / pe] = std::max(tol[e / pe], std::ldexp(mag * spec.scale, -16));
          }
          for (int32_t b = std::max(0, causal - c.local); b < causal; ++b) score[b] = 1e29;
          for (int32_t b = 0; b < std::min(causal, c.init); ++b) score[b] = 1e30;
          const int32_t* row = got.data() + (static_cast<int64_t>(h) * rows.num_rows + r) * c.topk;
          ExpectTopkRow(row, causal, c.topk, score, tol,
                        path + " head " + std::to_string(h) + " row " + std::to_string(r));
          if (HasFatalFailure()) return;
        }
      }
    }
  }
}

// The gather walk's plan (host only, no GPU needed): one group of one row
// per row, units covering [0, min(n_r, pool entries)) of each row in order,
// each unit naming its row and sequence; rows that see nothing get none.
// The warp block top-k (LaunchBlockTopk) on crafted rows, each checked
// against the SPEC §5 rule by a sort: every key above the k-th largest
// listed, then keys equal to it, lowest index first, up to k. The search
// starts below the bits all real keys share and takes two bits a step, so
// the rows are the edges of that: all keys equal; keys that differ only in
// the last bit or the last two; both signs (zeros below the cut); all
// negative, with ties at the cut; a row of the two sentinels alone; k = causal - 1; scores past the causal count larger
// than any real one (they must be ignored); widths of 8, 16 and 32 slots.
TEST(GpuBlockTest, WarpTopkOnCraftedRows) {
  SKIP_WITHOUT_GPU();
  struct Row {
    std::string name;
    std::vector<float> v;
    int32_t causal;
  };
  const int32_t width = 700;  // 22 slots a lane: the 32-slot kernel
  std::vector<Row> rows;
  auto add = [&](std::string name, std::vector<float> v, int32_t causal) {
    v.resize(width, 3e30f);  // past the causal count: larger than any real score
    rows.push_back({std::move(name), std::move(v), causal});
  };
  add("all equal", std::vector<float>(300, 0.75f), 300);
  {
    std::vector<float> v(500);
    for (int i = 0; i < 500; ++i) v[i] = i % 3 == 0 ? 1.0f : std::nextafter(1.0f, 2.0f);  // the last bit
    add("last bit", v, 500);
  }
  {
    std::vector<float> v(640);
    const uint32_t base = 0x3f800000u;
    for (int i = 0; i < 640; ++i) {
      const uint32_t u = base | static_cast<uint32_t>((i * 7) % 4);  // the last two bits
      std::memcpy(&v[i], &u, 4);
    }
    add("last two bits", v, 640);
  }
  {
    std::vector<float> v(257);
    for (int i = 0; i < 257; ++i) v[i] = (i % 4 == 0 ? -1.f : 1.f) * static_cast<float>(i % 13) * 0.5f;
    v[5] = -0.0f;  // zeros below the cut (this check compares floats, and
    v[6] = 0.0f;   // the keys order -0 below +0)
    add("signs, zeros below the cut", v, 257);
  }
  {
    std::vector<float> v(300);  // the cut among negative keys, with ties
    for (int i = 0; i < 300; ++i) v[i] = -0.5f - 0.25f * static_cast<float>(i % 37);
    add("all negative", v, 300);
  }
  {
    std::vector<float> v(40, 1e29f);
    for (int i = 0; i < 40; i += 5) v[i] = 1e30f;
    add("sentinels alone", v, 40);
  }
  {
    std::mt19937 rng(77);
    std::normal_distribution<float> nd(0.f, 1.f);
    std::vector<float> v(width);
    for (auto& x : v) x = nd(rng);
    add("k = causal - 1", std::vector<float>(v.begin(), v.begin() + 17), 17);
    add("normal, full width", v, width);
    add("normal, short", std::vector<float>(v.begin(), v.begin() + 9), 9);
  }
  for (const int32_t w : {200, 500, 700}) {  // the 8-, 16- and 32-slot kernels
    for (const int32_t k : {16, 1}) {
      const int32_t n = static_cast<int32_t>(rows.size());
      std::vector<float> scores(static_cast<size_t>(n) * w);
      std::vector<int32_t> causal(n);
      for (int32_t r = 0; r < n; ++r) {
        causal[r] = std::min(rows[r].causal, w);
        if (rows[r].name == "k = causal - 1") causal[r] = std::min(k + 1, w);
        std::copy(rows[r].v.begin(), rows[r].v.begin() + w, scores.begin() + static_cast<int64_t>(r) * w);
      }
      DeviceBuffers bufs;  // freed at scope exit
      auto dev = [&](size_t bytes) { return bufs.Get(bytes); };
      gpu::BlockTopkParams tp{};
      tp.scores = static_cast<float*>(dev(scores.size() * 4));
      tp.width = w;
      tp.causal = static_cast<int32_t*>(dev(causal.size() * 4));
      tp.num_rows = n;
      tp.num_heads = 1;
      tp.topk = k;
      tp.out = static_cast<int32_t*>(dev(static_cast<size_t>(n) * k * 4));
      ASSERT_EQ(gpu::CopyH2D(const_cast<float*>(tp.scores), scores.data(), scores.size() * 4, nullptr), gpu::kSuccess);
      ASSERT_EQ(gpu::CopyH2D(const_cast<int32_t*>(tp.causal), causal.data(), causal.size() * 4, nullptr),
                gpu::kSuccess);
      ASSERT_TRUE(gpu::LaunchBlockTopk(tp, nullptr).ok());
      std::vector<int32_t> got(static_cast<size_t>(n) * k, -7);
      ASSERT_EQ(gpu::CopyD2H(got.data(), tp.out, got.size() * 4, nullptr), gpu::kSuccess);
      ASSERT_EQ(gpu::StreamSynchronize(nullptr), gpu::kSuccess);
      for (int32_t r = 0; r < n; ++r) {
        const int32_t c = causal[r];
        const float* row = scores.data() + static_cast<int64_t>(r) * w;
        // The expected list: indices by score (larger first), ties by
        // index; the first k, then -1 where the row has fewer.
        std::vector<int32_t> want;
        if (c <= k) {
          for (int32_t i = 0; i < k; ++i) want.push_back(i < c ? i : -1);
        } else {
          std::vector<int32_t> idx(c);
          std::iota(idx.begin(), idx.end(), 0);
          std::stable_sort(idx.begin(), idx.end(), [&](int32_t a, int32_t b) { return row[a] > row[b]; });
          const float kth = row[idx[k - 1]];
          // Above the k-th in index order, then equal ones in index order.
          for (int32_t i = 0; i < c; ++i) if (row[i] > kth) want.push_back(i);
          for (int32_t i = 0; i < c && static_cast<int32_t>(want.size()) < k; ++i) {
            if (row[i] == kth) want.push_back(i);
          }
        }
        std::vector<int32_t> have(got.begin() + static_cast<int64_t>(r) * k, got.begin() + static_cast<int64_t>(r + 1) * k);
        EXPECT_EQ(have, want) << rows[r].name << " width " << w << " k " << k;
      }
    }
  }
}

// The claimed tail's rule (plan.h: WsTailUnits): the percent of the
// launch's units, only where the rule's group size is reached and every
// block keeps its minimum share.
TEST(GpuPlanTest, WsTailUnitsFollowTheRule) {
  const gpu::TailRule prefill{10, 4, 3};
  // Prefill 4k x 32k at two blocks per SM: groups of four rows.
  EXPECT_EQ(gpu::WsTailUnits(prefill, 131072, 264, 4), 13107);
  EXPECT_EQ(gpu::WsTailUnits(prefill, 131072, 264, 3), 13107);
  // Decode groups of one or two rows claim nothing under this rule.
  EXPECT_EQ(gpu::WsTailUnits(prefill, 65536, 396, 1), 0);
  EXPECT_EQ(gpu::WsTailUnits(prefill, 65536, 396, 2), 0);
  // Too short a launch: 90 % of 1000 units is under 4 a block for 264 blocks.
  EXPECT_EQ(gpu::WsTailUnits(prefill, 1000, 264, 4), 0);
  EXPECT_EQ(gpu::WsTailUnits(prefill, 1200, 264, 4), 120);  // 1080 >= 1056
  // Every launch (a knob's rule); none at 0 %, all of it at 100 % with no minimum.
  const gpu::TailRule everywhere{20, 4, 1};
  EXPECT_EQ(gpu::WsTailUnits(everywhere, 8192, 396, 1), 1638);
  EXPECT_EQ(gpu::WsTailUnits({0, 4, 1}, 8192, 396, 4), 0);
  EXPECT_EQ(gpu::WsTailUnits({100, 0, 1}, 50, 396, 1), 50);
  // Without the knob, the default: 20 % where groups have two rows or more
  // (next_n 2 decode and prefill) and every block keeps 24 units, none for
  // groups of one. Units of 256 entries over 396 blocks (three an SM).
  if (std::getenv("INDEXER_GPU_WS_TAIL") == nullptr) {
    const gpu::TailRule d = gpu::DefaultWsTail();
    EXPECT_EQ(d.percent, 20);
    EXPECT_EQ(d.min_group_rows, 2);
    EXPECT_EQ(d.min_items_per_cta, 24);
    EXPECT_EQ(gpu::WsTailUnits(d, 16384, 396, 2), 3276);    // B=128 x 32k next_n 2
    EXPECT_EQ(gpu::WsTailUnits(d, 32768, 396, 2), 6553);    // B=64 x 128k next_n 2
    EXPECT_EQ(gpu::WsTailUnits(d, 131072, 264, 4), 26214);  // prefill 4k x 32k
    EXPECT_EQ(gpu::WsTailUnits(d, 8192, 396, 2), 0);        // B=64 x 32k next_n 2: 21 a block
    EXPECT_EQ(gpu::WsTailUnits(d, 4096, 396, 2), 0);        // B=128 x 8k, B=8 x 128k next_n 2
    EXPECT_EQ(gpu::WsTailUnits(d, 2048, 396, 2), 0);        // B=64 x 8k next_n 2
    EXPECT_EQ(gpu::WsTailUnits(d, 65536, 396, 1), 0);       // one row a group
  }
}

TEST(GpuPlanTest, GatherCoversEachRowsPoolSlots) {
  const std::vector<int32_t> old_e = {0, 0, 40000, 100, 7}, new_e = {1, 17000, 40002, 164, 7};
  const std::vector<int32_t> q_lens = {1, 1, 2, 1, 0};
  std::vector<std::vector<int32_t>> pages(old_e.size());
  int32_t next = 0;
  for (size_t s = 0; s < new_e.size(); ++s) {
    for (int64_t i = 0; i < PagesFor(new_e[s], 64); ++i) pages[s].push_back(next++);
  }
  const StepRows rows = MakeStep(old_e, new_e, q_lens, 64, pages, 0);
  const int64_t pool = 2048 * 8;
  std::vector<gpu::LogitsGroup> groups;
  std::vector<gpu::LogitsUnit> units;
  gpu::PlanGather(rows, 0, rows.num_rows, pool, 132, &groups, &units);
  ASSERT_EQ(static_cast<int32_t>(groups.size()), rows.num_rows);
  size_t u = 0;
  for (int32_t r = 0; r < rows.num_rows; ++r) {
    const gpu::LogitsGroup& g = groups[r];
    EXPECT_EQ(g.row_begin, r);
    EXPECT_EQ(g.num_rows, 1);
    EXPECT_EQ(g.seq, rows.row_seq[r]);
    const int32_t extent = static_cast<int32_t>(std::min<int64_t>(rows.row_visible[r], pool));
    EXPECT_EQ(g.extent, extent) << "row " << r;
    int32_t at = 0;
    while (u < units.size() && units[u].group == r) {
      EXPECT_EQ(units[u].e_begin, at) << "row " << r;
      EXPECT_GT(units[u].e_end, units[u].e_begin);
      EXPECT_EQ(units[u].row_begin, r);
      EXPECT_EQ(units[u].num_rows, 1);
      EXPECT_EQ(units[u].seq, rows.row_seq[r]);
      EXPECT_EQ(units[u].e_begin % 64, 0) << "units start at whole tiles";
      at = units[u].e_end;
      ++u;
    }
    EXPECT_EQ(at, extent) << "row " << r;
  }
  EXPECT_EQ(u, units.size());
}

}  // namespace
}  // namespace gpu_test
}  // namespace indexer

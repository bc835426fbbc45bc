// The gpu backend against the cpu backend (indexer::CpuBackend) on the same
// inputs: K pages bit-exact after every write, top-k of every row by the
// SPEC §5 rule against a float64 reference (right count, and the set check
// of gpu_test_reference.h under the tolerance of the logits path that ran),
// for the tensor-core and the portable logits kernels. Skips without a GPU.
#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <functional>
#include <memory>
#include <random>
#include <set>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "gtest/gtest.h"
#include "kernels/backend.h"
#include "kernels/cpu/cpu_backend.h"
#include "kernels/format/fp8.h"
#include "kernels/format/mxfp4.h"
#include "kernels/format/numeric.h"
#include "kernels/gpu/gpu_backend.h"
#include "kernels/gpu/gpu_backend_impl.h"
#include "kernels/gpu/gpu_compat.h"
#include "kernels/gpu/knobs.h"
#include "kernels/gpu/params.h"
#include "kernels/gpu/topk_key.h"
#include "tests/gpu/gpu_test_pair.h"
#include "tests/gpu/gpu_test_reference.h"

namespace indexer {
namespace gpu_test {
namespace {

struct Shape {
  KvFormat format;
  int32_t page_entries;
  bool tiled;
  int32_t seqs;
  int32_t q_len_min, q_len_max;   // rows per sequence
  int32_t hist_min, hist_max;     // entries before the step
  int32_t heads;
  int32_t topk;
  int max_path;                   // logits path cap: 0 portable, 1 mma, 2 wgmma;
                                  // 3 / 4: the MFMA kernels as gfx942 / gfx950
  KInput::Kind k_kind = KInput::Kind::kFloat32;
  bool ue8m0 = true;
  int32_t chunk_rows = 0;         // server chunks of this many rows (0: one)
  Fp8Variant fp8 = Fp8Variant::kE4m3fn;  // FP8 caches: e4m3fn or e4m3fnuz
  int32_t ws_tail = 0;            // wgmma_ws's claimed tail, percent (no minimum share)
};


std::string Name(const Shape& s) {
  return std::string(s.format == KvFormat::kFp8 ? "fp8" : "mxfp4") + "_E" +
         std::to_string(s.page_entries) + (s.tiled ? "_tiled" : "") + "_B" +
         std::to_string(s.seqs) + "_q" + std::to_string(s.q_len_min) + "to" +
         std::to_string(s.q_len_max) + "_n" + std::to_string(s.hist_max) +
         "_H" + std::to_string(s.heads) + "_k" + std::to_string(s.topk) +
         PathSuffix(s.max_path) +
         (s.k_kind == KInput::Kind::kBf16 ? "_bf16" : "") +
         (s.k_kind == KInput::Kind::kQuantized ? "_quantized" : "") +
         (s.ue8m0 ? "" : "_plain") +
         (s.chunk_rows ? "_chunk" + std::to_string(s.chunk_rows) : "") +
         (s.fp8 == Fp8Variant::kE4m3fnuz ? "_fnuz" : "") +
         (s.ws_tail ? "_wstail" + std::to_string(s.ws_tail) : "");
}

PageLayout MakeLayout(const Shape& s) {
  // Tiled: the gfx942 preshuffle (16 entries x 16 bytes), 4 scale lanes.
  auto l = s.tiled ? PageLayout::Make(s.format, 128, s.page_entries, 16, 16,
                                      s.format == KvFormat::kMxfp4 ? 2 : 1)
                   : PageLayout::Make(s.format, 128, s.page_entries);
  EXPECT_TRUE(l.ok()) << l.status();
  PageLayout out = *l;
  out.fp8 = s.fp8;
  return out;
}

class GpuDenseTest : public ::testing::TestWithParam<Shape> {};

TEST_P(GpuDenseTest, WritesBitExactAndTopkMatchesCpu) {
  SKIP_WITHOUT_GPU();
  const Shape sh = GetParam();
  const PageLayout layout = MakeLayout(sh);
  std::mt19937 rng(1234 + sh.page_entries * 7 + sh.seqs);
  std::uniform_int_distribution<int32_t> hist(sh.hist_min, sh.hist_max);
  std::uniform_int_distribution<int32_t> ql(sh.q_len_min, sh.q_len_max);

  std::vector<int32_t> old_e, new_e, q_lens, zeros(sh.seqs, 0);
  std::vector<std::vector<int32_t>> pages(sh.seqs);
  int64_t total_pages = 0;
  for (int32_t s = 0; s < sh.seqs; ++s) {
    q_lens.push_back(ql(rng));
    old_e.push_back(hist(rng));
    new_e.push_back(old_e.back() + q_lens.back());
    total_pages += PagesFor(new_e.back(), sh.page_entries);
  }
  const int64_t pool_pages = total_pages + 5;
  std::vector<int32_t> perm(pool_pages);
  for (int64_t i = 0; i < pool_pages; ++i) perm[i] = static_cast<int32_t>(i);
  std::shuffle(perm.begin(), perm.end(), rng);
  int64_t next = 0;
  for (int32_t s = 0; s < sh.seqs; ++s) {
    for (int32_t i = 0; i < PagesFor(new_e[s], sh.page_entries); ++i) pages[s].push_back(perm[next++]);
  }
  Pair p = MakePair(layout, pool_pages);
  ASSERT_NE(p.gpu_pool.base, nullptr);
  static_cast<gpu::GpuBackend*>(p.gpu.get())->set_max_logits_path(sh.max_path);
  if (sh.ws_tail > 0) static_cast<gpu::GpuBackend*>(p.gpu.get())->set_ws_tail({sh.ws_tail, 0});

  // ---- history: entries [0, old) of every sequence, no rows ---------------
  const StepRows hist_rows = MakeStep(zeros, old_e, std::vector<int32_t>(sh.seqs, 0),
                                      sh.page_entries, pages, 0);
  KData hk = MakeK(rng, layout, hist_rows.NewEntries(), sh.k_kind, sh.ue8m0);
  ASSERT_TRUE(p.cpu->WriteEntries(layout, p.cpu_pool, hist_rows, nullptr, hk.input).ok());
  {
    auto ctx = p.gpu->PrepareStep(layout, hist_rows);
    ASSERT_TRUE(ctx.ok()) << ctx.status();
    auto w = p.gpu->WriteEntries(layout, p.gpu_pool, hist_rows, ctx->get(), hk.input);
    ASSERT_TRUE(w.ok()) << w.status();
  }
  ExpectPoolsEqual(p, layout);

  // ---- the step: new entries, then the dense top-k ------------------------
  const StepRows rows = MakeStep(old_e, new_e, q_lens, sh.page_entries, pages, sh.chunk_rows);
  KData nk = MakeK(rng, layout, rows.NewEntries(), sh.k_kind, sh.ue8m0);
  auto ctx = p.gpu->PrepareStep(layout, rows);
  ASSERT_TRUE(ctx.ok()) << ctx.status();
  ASSERT_TRUE(p.cpu->WriteEntries(layout, p.cpu_pool, rows, nullptr, nk.input).ok());
  auto w = p.gpu->WriteEntries(layout, p.gpu_pool, rows, ctx->get(), nk.input);
  ASSERT_TRUE(w.ok()) << w.status();
  ExpectPoolsEqual(p, layout);

  const QData q = MakeQ(rng, layout, rows.num_rows, sh.heads);
  std::vector<int32_t> got(static_cast<size_t>(rows.num_rows) * sh.topk, -7);
  std::vector<int32_t> want(got.size(), -7);
  auto t = p.gpu->DenseTopk(layout, p.gpu_pool, rows, ctx->get(), q.input, sh.topk, got.data());
  ASSERT_TRUE(t.ok()) << t.status();
  ASSERT_TRUE(p.cpu->DenseTopk(layout, p.cpu_pool, rows, nullptr, q.input, sh.topk, want.data()).ok());
  const std::string path = static_cast<gpu::GpuBackend*>(p.gpu.get())->last_logits_path();
  if (sh.fp8 == Fp8Variant::kE4m3fnuz) {
    EXPECT_EQ(path.find("mma"), std::string::npos) << "e4m3fnuz cache on an e4m3fn tensor-core path: " << path;
  }
  std::printf("[   path   ] logits kernel: %s\n", path.c_str());
  // wgmma_ws: the same call again, on the state the first one left (the
  // claimed tail's counters, the split top-k's row state that the fused
  // histogram filled: each must be back at zero), checked against the
  // reference below.
  // (A tail shape must be on it: the set comparison below reads `again`.)
  if (sh.ws_tail > 0) ASSERT_EQ(path, "wgmma_ws");
  std::vector<int32_t> again;
  if (path == "wgmma_ws") {
    again.assign(got.size(), -7);
    t = p.gpu->DenseTopk(layout, p.gpu_pool, rows, ctx->get(), q.input, sh.topk, again.data());
    ASSERT_TRUE(t.ok()) << t.status();
  }
  if (sh.ws_tail > 0) {
    // The claimed tail: the second launch's rows as sets equal the first's
    // (the split top-k's order is not fixed).
    for (int32_t r = 0; r < rows.num_rows; ++r) {
      std::vector<int32_t> a(got.begin() + static_cast<int64_t>(r) * sh.topk,
                             got.begin() + static_cast<int64_t>(r + 1) * sh.topk);
      std::vector<int32_t> b(again.begin() + static_cast<int64_t>(r) * sh.topk,
                             again.begin() + static_cast<int64_t>(r + 1) * sh.topk);
      std::sort(a.begin(), a.end());
      std::sort(b.begin(), b.end());
      EXPECT_EQ(b, a) << "row " << r << ": the second launch with the claimed tail";
    }
  }
  ExpectMfmaPath(sh.max_path, sh.format, path, sh.fp8 == Fp8Variant::kE4m3fnuz);
  // Each against the reference under its own arithmetic's tolerance.
  const PathTolerance cpu_t = ToleranceFor("cpu", sh.format), gpu_t = ToleranceFor(path, sh.format);
  Margin cpu_m, gpu_m;
  for (int32_t r = 0; r < rows.num_rows; ++r) {
    const int32_t n = rows.row_visible[r];
    const RefRow ref = RefLogits(p, layout, rows, q, r);
    ExpectTopkRow(want.data() + static_cast<int64_t>(r) * sh.topk, n, sh.topk, ref.logit, ref.Tol(cpu_t),
                  "cpu row " + std::to_string(r), &cpu_m);
    ExpectTopkRow(got.data() + static_cast<int64_t>(r) * sh.topk, n, sh.topk, ref.logit, ref.Tol(gpu_t),
                  "gpu (" + path + ") row " + std::to_string(r) + " n " + std::to_string(n), &gpu_m);
    if (!again.empty()) {
      ExpectTopkRow(again.data() + static_cast<int64_t>(r) * sh.topk, n, sh.topk, ref.logit, ref.Tol(gpu_t),
                    "gpu (" + path + ", second call) row " + std::to_string(r) + " n " + std::to_string(n),
                    &gpu_m);
    }
    if (HasFatalFailure()) return;
  }
  cpu_m.Print("cpu");
  gpu_m.Print(path);
}

std::vector<Shape> Shapes() {
  using K = KInput::Kind;
  const KvFormat f8 = KvFormat::kFp8, mx = KvFormat::kMxfp4;
  return {
      // decode, next_n 1..4, odd page sizes (portable: E not a multiple of 4)
      {f8, 1, false, 5, 1, 1, 0, 300, 64, 64, 2},
      {f8, 3, false, 23, 1, 4, 0, 500, 64, 128, 2},
      {f8, 16, false, 5, 1, 2, 100, 3000, 64, 256, 2},
      {f8, 64, false, 23, 1, 4, 0, 5000, 64, 512, 2},
      {f8, 64, false, 23, 1, 4, 0, 5000, 64, 512, 0},
      {f8, 64, true, 5, 1, 3, 0, 2000, 64, 256, 2},
      // the warp-specialized wgmma kernel (tensor-mapped pools: linear, E a
      // multiple of 64)
      {f8, 64, false, 23, 1, 1, 0, 5000, 64, 512, 2},
      {f8, 64, false, 23, 1, 2, 0, 5000, 64, 512, 2},
      {f8, 64, false, 1, 1, 1, 30000, 40000, 64, 2048, 2},   // split top-k
      {f8, 64, false, 3, 2, 2, 9000, 20000, 64, 1024, 2, K::kBf16},
      // the split top-k's first histogram built in the ws epilogue: long
      // rows beside rows of n <= k (left out of it), groups of one and two
      // rows in one launch, E = 128 pages
      {f8, 64, false, 23, 1, 2, 0, 30000, 64, 2048, 2},
      {f8, 64, false, 23, 1, 1, 0, 30000, 64, 1024, 2},
      {f8, 128, false, 5, 1, 1, 9000, 20000, 64, 512, 2},
      // ... with every ring slot reused and two or three units a block
      // (~3900 tiles: units of 256 entries over 396 blocks)
      {f8, 64, false, 8, 1, 1, 28000, 32000, 64, 2048, 2},
      {f8, 64, false, 8, 2, 2, 28000, 32000, 64, 2048, 2},
      // small totals: one-tile units (a unit from the middle of an E = 128
      // page too) and units of a few tiles (n 40000 above: two or three)
      {f8, 64, false, 2, 1, 1, 0, 4000, 64, 512, 2},
      {f8, 128, false, 3, 1, 2, 0, 3000, 64, 256, 2},
      // its teams: next_n 2 alone (two warpgroups, one row each, on every
      // tile); next_n 3..4 and groups of 1..4 rows (a team member with no
      // rows in a group); E = 128 pages (two tiles a page)
      {f8, 64, false, 23, 2, 2, 0, 5000, 64, 512, 2},
      {f8, 64, false, 23, 3, 4, 0, 5000, 64, 512, 2},
      {f8, 128, false, 7, 1, 4, 100, 6000, 64, 512, 2},
      // prefill groups of 4 rows (n_r one apart) over many units, and
      // prefill chunks cut by server chunks on E = 128 (groups of 1..4 rows)
      {f8, 64, false, 1, 37, 43, 3000, 6000, 64, 1024, 2},
      {f8, 128, false, 2, 20, 70, 0, 3000, 64, 256, 2, K::kFloat32, true, 37},
      // a prefill chunk of 40 rows over ~20000 entries: every ring slot of the
      // 4-row ws configuration reused many times
      {f8, 64, false, 1, 40, 40, 19000, 20000, 64, 1024, 2},
      {f8, 128, false, 2, 40, 40, 19000, 20000, 64, 512, 2},
      {f8, 16, false, 5, 1, 4, 0, 900, 64, 64, 2, K::kFloat32, false},
      {f8, 16, false, 5, 1, 4, 0, 900, 64, 64, 2, K::kQuantized},
      {f8, 64, false, 5, 1, 4, 0, 900, 8, 64, 2},            // H = 8: portable
      // prefill chunks mixed with decode, server chunks
      {f8, 64, false, 3, 5, 70, 0, 3000, 64, 256, 2, K::kFloat32, true, 37},
      {f8, 16, true, 3, 5, 70, 0, 3000, 64, 256, 0, K::kFloat32, true, 37},
      // the mma.sync path on the same shapes as wgmma
      {f8, 64, false, 23, 1, 4, 0, 5000, 64, 512, 1},
      {f8, 16, true, 3, 5, 70, 0, 3000, 64, 256, 1, K::kFloat32, true, 37},
      // e4m3fnuz caches (gfx942's FP8): written and read by the portable
      // kernels whatever path cap (the sm_90 paths multiply e4m3fn)
      {f8, 64, false, 23, 1, 4, 0, 5000, 64, 512, 2, K::kFloat32, true, 0, Fp8Variant::kE4m3fnuz},
      {f8, 16, true, 3, 5, 70, 0, 3000, 64, 256, 2, K::kFloat32, false, 37, Fp8Variant::kE4m3fnuz},
      {f8, 16, false, 5, 1, 4, 0, 900, 64, 64, 2, K::kQuantized, true, 0, Fp8Variant::kE4m3fnuz},
      // MXFP4
      {mx, 1, false, 5, 1, 1, 0, 300, 64, 64, 2},
      {mx, 3, false, 23, 1, 4, 0, 500, 64, 128, 2},
      {mx, 64, false, 23, 1, 4, 0, 5000, 64, 512, 2},
      {mx, 64, false, 23, 1, 4, 0, 5000, 64, 512, 0},
      {mx, 64, true, 5, 1, 2, 0, 2000, 64, 256, 2},
      {mx, 64, false, 1, 1, 1, 30000, 40000, 64, 2048, 2},
      {mx, 64, false, 3, 5, 70, 0, 3000, 64, 256, 2, K::kBf16, true, 37},
      {mx, 16, false, 5, 1, 4, 0, 900, 64, 64, 2, K::kQuantized},
      // the MXFP4 wgmma kernel (linear E % 64, groups of <= 2 rows) and
      // mma.sync on the same shapes
      {mx, 64, false, 23, 1, 1, 0, 5000, 64, 512, 2},
      {mx, 64, false, 23, 1, 2, 0, 5000, 64, 512, 2},
      {mx, 64, false, 23, 1, 2, 0, 5000, 64, 512, 1},
      {mx, 128, false, 5, 1, 2, 100, 3000, 64, 256, 2},
      {mx, 128, false, 1, 1, 1, 60, 70, 64, 64, 2},
      {mx, 64, false, 3, 2, 2, 9000, 20000, 64, 1024, 2, K::kQuantized},
      {mx, 128, false, 2, 1, 1, 30000, 40000, 64, 2048, 2, K::kBf16},
      // 32 rows over ~30000 entries: every ring slot of the MXFP4 kernel
      // reused many times (for racecheck)
      {mx, 64, false, 16, 2, 2, 29000, 30000, 64, 1024, 2},
      // 24 one-query rows over ~30000 entries: the one-row configuration
      // of the MXFP4 kernel with every ring slot reused (for racecheck)
      {mx, 64, false, 24, 1, 1, 29000, 30000, 64, 1024, 2},
      // H = 32 (DeepSeek-V4.1) and 16 on the tensor-core kernels, H a
      // template constant: warp-specialized wgmma (N = 32 and 64 a warpgroup,
      // teams of two for 3-4 rows; N = 16, 32, 64 at H = 16), the serial
      // wgmma kernel (tiled pages), mma.sync, and MXFP4 wgmma (the per-block
      // route's head slices of 32 and 16)
      {f8, 64, false, 23, 1, 1, 0, 5000, 32, 512, 2},
      {f8, 64, false, 23, 2, 2, 0, 5000, 32, 512, 2},
      {f8, 64, false, 23, 3, 4, 0, 5000, 32, 512, 2},
      {f8, 64, false, 1, 40, 40, 19000, 20000, 32, 1024, 2},
      {f8, 128, false, 7, 1, 4, 100, 6000, 32, 512, 2},
      {f8, 64, false, 23, 1, 4, 0, 5000, 16, 512, 2},
      {f8, 128, false, 2, 40, 40, 19000, 20000, 16, 512, 2},
      {f8, 64, true, 5, 1, 3, 0, 2000, 32, 256, 2},
      {f8, 16, true, 3, 5, 70, 0, 3000, 16, 256, 2, K::kFloat32, true, 37},
      // wgmma_ws with a claimed tail (every launch claims: no minimum
      // share): one row, two rows (a team), groups of up to four, the fused
      // histogram with ring slots reused, H 32, a prefill chunk, server
      // chunks
      {f8, 64, false, 23, 1, 1, 0, 5000, 64, 512, 2, K::kFloat32, true, 0, Fp8Variant::kE4m3fn, 25},
      {f8, 64, false, 8, 2, 2, 28000, 32000, 64, 2048, 2, K::kFloat32, true, 0, Fp8Variant::kE4m3fn, 25},
      {f8, 128, false, 7, 1, 4, 100, 6000, 64, 512, 2, K::kFloat32, true, 0, Fp8Variant::kE4m3fn, 25},
      {f8, 64, false, 23, 1, 2, 0, 30000, 64, 2048, 2, K::kFloat32, true, 0, Fp8Variant::kE4m3fn, 50},
      {f8, 64, false, 23, 1, 1, 0, 5000, 32, 512, 2, K::kFloat32, true, 0, Fp8Variant::kE4m3fn, 25},
      {f8, 64, false, 1, 40, 40, 19000, 20000, 64, 1024, 2, K::kFloat32, true, 0, Fp8Variant::kE4m3fn, 25},
      {f8, 64, false, 3, 5, 70, 0, 3000, 64, 256, 2, K::kFloat32, true, 37, Fp8Variant::kE4m3fn, 50},
      {f8, 64, false, 23, 1, 4, 0, 5000, 32, 512, 1},
      {f8, 16, true, 3, 5, 70, 0, 3000, 16, 256, 1, K::kFloat32, true, 37},
      {mx, 64, false, 23, 1, 1, 0, 5000, 32, 512, 2},
      {mx, 64, false, 23, 1, 2, 0, 5000, 32, 512, 2},
      {mx, 128, false, 5, 1, 2, 100, 3000, 16, 256, 2},
      {mx, 64, false, 16, 2, 2, 29000, 30000, 32, 1024, 2},
      {mx, 64, true, 5, 1, 2, 0, 2000, 32, 256, 2},
      {mx, 64, false, 23, 1, 4, 0, 5000, 16, 512, 1},
      {mx, 64, false, 23, 1, 4, 0, 5000, 32, 512, 0},
  };
}

INSTANTIATE_TEST_SUITE_P(Shapes, GpuDenseTest, ::testing::ValuesIn(Shapes()),
                         [](const auto& info) { return Name(info.param); });

// Every shape above through the wave64 MFMA kernels (on CUDA: the
// instruction model of the compat seam): FP8 as gfx942 (e4m3fnuz operands)
// and as gfx950 (OCP e4m3), MXFP4 as gfx950 (scaled FP4 MFMA).
std::vector<Shape> MfmaShapes() {
  std::vector<Shape> out;
  std::set<std::string> names;
  for (Shape s : Shapes()) {
    if (s.ws_tail > 0) continue;  // wgmma_ws's own shapes
    for (int path : {gpu::kPathMfmaGfx942, gpu::kPathMfmaGfx950}) {
      if (s.format == KvFormat::kMxfp4 && path == gpu::kPathMfmaGfx942) continue;
      s.max_path = path;
      if (names.insert(Name(s)).second) out.push_back(s);
    }
  }
  return out;
}

INSTANTIATE_TEST_SUITE_P(Mfma, GpuDenseTest, ::testing::ValuesIn(MfmaShapes()),
                         [](const auto& info) { return Name(info.param); });

// MXFP4 with adversarial block exponents (SPEC §3 dot products must stay
// exact per block): pre-quantized K and Q whose blocks differ by 14..30
// binary orders inside one entry or one head, arranged so that the small
// blocks meet large blocks of the other operand and carry as much of the
// dot product as the rest. Sequence kinds (s % 4):
//   0: Q spans 13 (block 0 high), K entries normal or block 0 low by 14..20;
//   1: Q spans 20..24 (block 1 high), K normal or block 1 low by the same;
//   2: K entries near 2^70 against Q at 2^-70;
//   3: normal, with all-zero blocks in some K entries and Q heads (scale
//      byte 1, as the quantizer writes them).
// The wgmma kernel takes its fast route, the per-block route for K and the
// unscaled-Q route on these; mma.sync and portable are run on them too.
struct AdversarialShape {
  int32_t page_entries;
  int32_t q_len_max;
  int max_path;
  int32_t heads = 64;
};

class GpuMxfp4AdversarialTest : public ::testing::TestWithParam<AdversarialShape> {};

TEST_P(GpuMxfp4AdversarialTest, TopkMatchesReference) {
  SKIP_WITHOUT_GPU();
  const AdversarialShape sh = GetParam();
  const PageLayout layout = *PageLayout::Make(KvFormat::kMxfp4, 128, sh.page_entries);
  const int32_t seqs = 8, heads = sh.heads, topk = 128;
  std::mt19937 rng(99 + sh.page_entries + sh.q_len_max);
  std::uniform_int_distribution<int32_t> hist(700, 2600), ql(1, sh.q_len_max), byte(0, 255);
  std::vector<int32_t> old_e, new_e, q_lens, zeros(seqs, 0);
  std::vector<std::vector<int32_t>> pages(seqs);
  int64_t total_pages = 0;
  for (int32_t s = 0; s < seqs; ++s) {
    q_lens.push_back(ql(rng));
    old_e.push_back(hist(rng));
    new_e.push_back(old_e.back() + q_lens.back());
    total_pages += PagesFor(new_e.back(), sh.page_entries);
  }
  int64_t next = 0;
  for (int32_t s = 0; s < seqs; ++s) {
    for (int32_t i = 0; i < PagesFor(new_e[s], sh.page_entries); ++i) pages[s].push_back(next++);
  }
  Pair p = MakePair(layout, total_pages);
  ASSERT_NE(p.gpu_pool.base, nullptr);
  static_cast<gpu::GpuBackend*>(p.gpu.get())->set_max_logits_path(sh.max_path);
  const StepRows rows = MakeStep(zeros, new_e, q_lens, sh.page_entries, pages, 0);

  // ---- K: [n, 64 packed | 4 scale bytes], sequence by sequence -----------
  const int32_t eb = layout.entry_bytes();
  std::vector<uint8_t> kq(static_cast<size_t>(rows.NewEntries()) * eb);
  std::uniform_int_distribution<int32_t> kind(0, 3), base(120, 134), wide(14, 20), block(0, 3);
  for (int32_t s = 0; s < seqs; ++s) {
    for (int32_t e = rows.seq_k_begin[s]; e < rows.seq_k_begin[s + 1]; ++e) {
      uint8_t* x = kq.data() + static_cast<int64_t>(e) * eb;
      for (int32_t i = 0; i < 64; ++i) x[i] = static_cast<uint8_t>(byte(rng));
      const int32_t b0 = base(rng), k = kind(rng);
      for (int32_t b = 0; b < 4; ++b) x[64 + b] = static_cast<uint8_t>(b0 + block(rng) % 2);
      // Wide entries in half of the 64-entry tiles: the others stay fast.
      if (s % 4 == 0 && k < 2 && (e - rows.seq_k_begin[s]) % 128 < 64) {
        x[64 + 0] = static_cast<uint8_t>(b0 - wide(rng));
      }
      if (s % 4 == 1 && k < 2) x[64 + 1] = static_cast<uint8_t>(b0 - 20 - block(rng));
      if (s % 4 == 3 && k == 0) {
        const int32_t zb = block(rng);
        for (int32_t i = 0; i < 16; ++i) x[zb * 16 + i] = 0;
        x[64 + zb] = 1;
      }
      if (s % 4 == 2 && k == 1) {
        for (int32_t b = 0; b < 4; ++b) x[64 + b] = static_cast<uint8_t>(127 + 70 + block(rng));
      }
    }
  }
  KInput kin;
  kin.kind = KInput::Kind::kQuantized;
  kin.data = kq.data();
  ASSERT_TRUE(p.cpu->WriteEntries(layout, p.cpu_pool, rows, nullptr, kin).ok());
  auto ctx = p.gpu->PrepareStep(layout, rows);
  ASSERT_TRUE(ctx.ok()) << ctx.status();
  auto w = p.gpu->WriteEntries(layout, p.gpu_pool, rows, ctx->get(), kin);
  ASSERT_TRUE(w.ok()) << w.status();
  ExpectPoolsEqual(p, layout);

  // ---- Q: the sequence's kind of spans -----------------------------------
  QData q = MakeQ(rng, layout, rows.num_rows, heads);
  for (int32_t r = 0; r < rows.num_rows; ++r) {
    const int32_t s = rows.row_seq[r];
    for (int32_t h = 0; h < heads; ++h) {
      uint8_t* sc = q.scales.data() + (static_cast<int64_t>(r) * heads + h) * 4;
      uint8_t* v = q.values.data() + (static_cast<int64_t>(r) * heads + h) * 64;
      const int32_t b0 = base(rng);
      for (int32_t b = 0; b < 4; ++b) sc[b] = static_cast<uint8_t>(b0 + block(rng) % 2);
      if (s % 4 == 0) sc[0] = static_cast<uint8_t>(b0 + 13 - block(rng) % 2);
      if (s % 4 == 1) sc[1] = static_cast<uint8_t>(b0 + 20 + block(rng));
      if (s % 4 == 2) {
        for (int32_t b = 0; b < 4; ++b) sc[b] = static_cast<uint8_t>(sc[b] - 70);
      }
      if (s % 4 == 3) {
        if (h % 3 == 0) {
          const int32_t zb = block(rng);
          for (int32_t i = 0; i < 16; ++i) v[zb * 16 + i] = static_cast<uint8_t>(v[zb * 16 + i] & 0x88);
          sc[zb] = 1;
        }
      }
    }
  }
  std::vector<int32_t> got(static_cast<size_t>(rows.num_rows) * topk, -7);
  auto t = p.gpu->DenseTopk(layout, p.gpu_pool, rows, ctx->get(), q.input, topk, got.data());
  ASSERT_TRUE(t.ok()) << t.status();
  const std::string path = static_cast<gpu::GpuBackend*>(p.gpu.get())->last_logits_path();
  std::printf("[   path   ] logits kernel: %s\n", path.c_str());
  gpu::DeviceProp prop;
  ASSERT_EQ(gpu::GetDeviceProperties(&prop, 0), gpu::kSuccess);
  if (sh.max_path == 2 && prop.major == 9 && prop.minor == 0 && std::getenv("INDEXER_GPU_WGMMA_MXFP4") == nullptr &&
      std::getenv("INDEXER_GPU_MFMA_MODEL") == nullptr) {
    EXPECT_EQ(path, "wgmma_mxfp4");
  }
  ExpectMfmaPath(sh.max_path, KvFormat::kMxfp4, path);
  const PathTolerance gpu_t = ToleranceFor(path, KvFormat::kMxfp4);
  Margin m;
  for (int32_t r = 0; r < rows.num_rows; ++r) {
    const RefRow ref = RefLogits(p, layout, rows, q, r);
    ExpectTopkRow(got.data() + static_cast<int64_t>(r) * topk, rows.row_visible[r], topk, ref.logit,
                  ref.Tol(gpu_t),
                  "gpu (" + path + ") row " + std::to_string(r) + " seq " + std::to_string(rows.row_seq[r]),
                  &m);
    if (HasFatalFailure()) return;
  }
  m.Print(path);
}

INSTANTIATE_TEST_SUITE_P(Scales, GpuMxfp4AdversarialTest,
                         ::testing::Values(AdversarialShape{64, 1, 2}, AdversarialShape{128, 1, 2},
                                           AdversarialShape{64, 2, 2}, AdversarialShape{128, 2, 2},
                                           AdversarialShape{64, 2, 1}, AdversarialShape{64, 2, 0},
                                           AdversarialShape{64, 2, 2, 32}, AdversarialShape{128, 1, 2, 16},
                                           AdversarialShape{64, 2, 1, 32},
                                           AdversarialShape{64, 1, gpu::kPathMfmaGfx950},
                                           AdversarialShape{128, 2, gpu::kPathMfmaGfx950}),
                         [](const auto& info) {
                           return "E" + std::to_string(info.param.page_entries) + "_q" +
                                  std::to_string(info.param.q_len_max) + "_H" + std::to_string(info.param.heads) +
                                  PathSuffix(info.param.max_path);
                         });

// A tiny logits workspace forces sub-chunks inside the server's chunks
// (~9 of them: more timed kernels than one call's events, so the call also
// waits midway).
TEST(GpuBackendTest, SmallWorkspaceSplitsChunks) {
  SKIP_WITHOUT_GPU();
  setenv("INDEXER_GPU_LOGITS_MB", "1", 1);
  auto layout = *PageLayout::Make(KvFormat::kFp8, 128, 64);
  auto gpu = MakeGpuBackend(0, 0);
  unsetenv("INDEXER_GPU_LOGITS_MB");
  ASSERT_TRUE(gpu.ok()) << gpu.status();
  CpuBackend cpu(0);
  std::mt19937 rng(7);
  const int32_t seqs = 2, q_len = 250, hist = 4000;
  std::vector<std::vector<int32_t>> pages(seqs);
  const int32_t per = (hist + q_len + 63) / 64;
  for (int32_t s = 0; s < seqs; ++s) for (int32_t i = 0; i < per; ++i) pages[s].push_back(s * per + i);
  const PoolHandle cpool = *cpu.AllocatePool(layout, seqs * per);
  auto gp = (*gpu)->AllocatePool(layout, seqs * per);
  ASSERT_TRUE(gp.ok());
  const StepRows rows = MakeStep({0, 0}, {hist + q_len, hist + q_len}, {q_len, q_len}, 64, pages, 0);
  KData k = MakeK(rng, layout, rows.NewEntries(), KInput::Kind::kFloat32, true);
  ASSERT_TRUE(cpu.WriteEntries(layout, cpool, rows, nullptr, k.input).ok());
  ASSERT_TRUE((*gpu)->WriteEntries(layout, *gp, rows, nullptr, k.input).ok());
  const QData q = MakeQ(rng, layout, rows.num_rows, 64);
  std::vector<int32_t> got(rows.num_rows * 128), want(rows.num_rows * 128);
  auto t = (*gpu)->DenseTopk(layout, *gp, rows, nullptr, q.input, 128, got.data());
  ASSERT_TRUE(t.ok()) << t.status();
  ASSERT_TRUE(cpu.DenseTopk(layout, cpool, rows, nullptr, q.input, 128, want.data()).ok());
  const std::string path = static_cast<gpu::GpuBackend*>(gpu->get())->last_logits_path();
  std::printf("[   path   ] logits kernel: %s\n", path.c_str());
  // Every row of both against the reference, each under its arithmetic's
  // tolerance: a sub-chunk that lost or shifted rows shows as a wrong set.
  const PathTolerance cpu_t = ToleranceFor("cpu", layout.format), gpu_t = ToleranceFor(path, layout.format);
  Margin cpu_m, gpu_m;
  for (int32_t r = 0; r < rows.num_rows; ++r) {
    const int32_t n = rows.row_visible[r];
    const RefRow ref = RefLogits(cpu, cpool, layout, rows, q, r);
    ExpectTopkRow(want.data() + r * 128, n, 128, ref.logit, ref.Tol(cpu_t), "cpu row " + std::to_string(r),
                  &cpu_m);
    ExpectTopkRow(got.data() + r * 128, n, 128, ref.logit, ref.Tol(gpu_t),
                  "gpu (" + path + ") row " + std::to_string(r) + " n " + std::to_string(n), &gpu_m);
    if (HasFatalFailure()) return;
  }
  cpu_m.Print("cpu");
  gpu_m.Print(path);
}

// ---- top-k kernels on given logits -------------------------------------------
// Every top-k route (one block per row with its keys in shared memory, one
// block per row reading global memory, rows split over blocks) on logits
// chosen to stress it: crowded into a few histogram bins, many exact ties
// at the cut, all equal, signed zeros, extremes. The check is exact: right
// count, distinct in-range indices, -1 fill, nothing kept below the k-th
// value and nothing left out above it.
struct TopkCase {
  const char* dist;
  int32_t rows;
  int32_t n_min, n_max;  // visible entries per row
  int32_t topk;
  bool coop_room;        // candidate buffers large enough to split rows
  int expect_route;      // 0 rows in shared memory, 1 rows from global, 2 split
};

std::vector<float> TopkLogits(const std::string& dist, int64_t n, std::mt19937& rng) {
  std::vector<float> v(n);
  std::normal_distribution<float> normal(10.f, 0.5f);
  std::uniform_int_distribution<int> pick(0, 15);
  for (int64_t i = 0; i < n; ++i) {
    if (dist == "crowded") {
      v[i] = normal(rng);  // a few exponent bins hold everything
    } else if (dist == "ties") {
      v[i] = 1.f + 0.125f * static_cast<float>(pick(rng));  // 16 values
    } else if (dist == "equal") {
      v[i] = 3.f;
    } else {  // mixed: signed zeros, negatives, extremes, subnormals
      const int c = pick(rng);
      v[i] = c == 0 ? 0.f : c == 1 ? -0.f : c == 2 ? 3.0e38f : c == 3 ? -3.0e38f
           : c == 4 ? 1e-40f : c == 5 ? -1e-40f : (normal(rng) - 10.f) * 1e3f;
    }
  }
  return v;
}

class GpuTopkKernelTest : public ::testing::TestWithParam<TopkCase> {};

TEST_P(GpuTopkKernelTest, ExactSetOnStressedLogits) {
  SKIP_WITHOUT_GPU();
  const TopkCase c = GetParam();
  std::mt19937 rng(1234 + c.n_max + c.topk);
  std::uniform_int_distribution<int32_t> len(c.n_min, c.n_max);
  std::vector<int32_t> visible(c.rows);
  for (auto& n : visible) n = len(rng);
  const int32_t max_visible = *std::max_element(visible.begin(), visible.end());
  const int64_t stride = (max_visible + 3) / 4 * 4;
  std::vector<float> logits(c.rows * stride, -1.f);
  for (int32_t r = 0; r < c.rows; ++r) {
    const std::vector<float> v = TopkLogits(c.dist, visible[r], rng);
    std::copy(v.begin(), v.end(), logits.begin() + r * stride);
  }
  const int64_t cand_capacity = c.coop_room ? stride * c.rows : 0;
  gpu::TopkParams tp{};
  tp.stride = stride;
  tp.num_rows = c.rows;
  tp.topk = c.topk;
  gpu::PlanTopkSplit(c.rows, max_visible, c.topk, 132, cand_capacity, &tp);
  const int route = tp.cand_stride > 0 ? 2 : max_visible > gpu::kTopkCache ? 1 : 0;
  ASSERT_EQ(route, c.expect_route) << "slices " << tp.slices << " slice_len " << tp.slice_len;

  DeviceBuffers bufs;  // freed at scope exit
  auto dev = [&](size_t bytes) { return bufs.Get(bytes); };
  gpu::Stream stream = nullptr;
  ASSERT_EQ(gpu::StreamCreate(&stream), gpu::kSuccess);
  tp.logits = static_cast<float*>(dev(logits.size() * 4));
  tp.row_visible = static_cast<int32_t*>(dev(c.rows * 4));
  tp.out = static_cast<int32_t*>(dev(int64_t{c.rows} * c.topk * 4));
  tp.state = static_cast<uint32_t*>(dev(int64_t{c.rows} * gpu::kTopkStateWords * 4));
  tp.cand_keys = static_cast<uint32_t*>(dev(std::max<int64_t>(cand_capacity, 1) * 4));
  tp.cand_pos = static_cast<int32_t*>(dev(std::max<int64_t>(cand_capacity, 1) * 4));
  ASSERT_EQ(gpu::CopyH2D(const_cast<float*>(tp.logits), logits.data(), logits.size() * 4, stream), gpu::kSuccess);
  ASSERT_EQ(gpu::CopyH2D(const_cast<int32_t*>(tp.row_visible), visible.data(), c.rows * 4, stream), gpu::kSuccess);
  ASSERT_EQ(gpu::MemsetAsync(tp.state, 0, int64_t{c.rows} * gpu::kTopkStateWords * 4, stream), gpu::kSuccess);
  std::vector<int32_t> got(int64_t{c.rows} * c.topk);
  // Twice: the split route must leave its per-row state clean for reuse; the
  // split route then once for each other stage-B register cap, whatever the
  // launch's size would pick.
  const int32_t planned_cap = tp.emit_cap;
  std::vector<int32_t> caps = {planned_cap, planned_cap};
  if (route == 2) {
    for (int32_t cap : {1, 3, 4}) if (cap != planned_cap) caps.push_back(cap);
  }
  // Then the split route as it runs after a logits kernel that built the
  // rows' first histogram (TopkParams::hist_ready), at each cap, from the
  // host's histogram of the top key bits (rows of n <= k left out, as the
  // kernel leaves them); it must leave the state zeroed.
  const int first_hist = static_cast<int>(caps.size());
  if (route == 2) {
    for (int32_t cap : {1, 3, 4}) caps.push_back(cap);
  }
  std::vector<uint32_t> hist(int64_t{c.rows} * gpu::kTopkStateWords, 0);
  for (int32_t r = 0; r < c.rows; ++r) {
    if (visible[r] <= c.topk) continue;
    for (int32_t e = 0; e < visible[r]; ++e) {
      ++hist[int64_t{r} * gpu::kTopkStateWords + gpu::TopBin(gpu::OrderedKey(logits[r * stride + e]))];
    }
  }
  for (int round = 0; round < static_cast<int>(caps.size()); ++round) {
    tp.emit_cap = caps[round];
    tp.hist_ready = round >= first_hist;
    if (tp.hist_ready) {
      ASSERT_EQ(gpu::CopyH2D(tp.state, hist.data(), hist.size() * 4, stream), gpu::kSuccess);
    }
    ASSERT_EQ(gpu::MemsetAsync(tp.out, 0x7f, got.size() * 4, stream), gpu::kSuccess);
    ASSERT_TRUE(gpu::LaunchTopk(tp, stream).ok());
    std::vector<uint32_t> state_after(hist.size(), 1);
    ASSERT_EQ(gpu::CopyD2H(state_after.data(), tp.state, state_after.size() * 4, stream), gpu::kSuccess);
    ASSERT_EQ(gpu::CopyD2H(got.data(), tp.out, got.size() * 4, stream), gpu::kSuccess);
    ASSERT_EQ(gpu::StreamSynchronize(stream), gpu::kSuccess);
    for (size_t i = 0; i < state_after.size(); ++i) {
      ASSERT_EQ(state_after[i], 0u) << c.dist << " round " << round << (tp.hist_ready ? " hist" : "")
                                    << ": row " << i / gpu::kTopkStateWords << " state word "
                                    << i % gpu::kTopkStateWords << " left set";
    }
    for (int32_t r = 0; r < c.rows; ++r) {
      const std::string what = std::string(c.dist) + " round " + std::to_string(round) +
                               " cap " + std::to_string(tp.emit_cap) + (tp.hist_ready ? " hist" : "") +
                               " row " + std::to_string(r) + " n " + std::to_string(visible[r]);
      const float* x = logits.data() + r * stride;
      const int32_t* g = got.data() + int64_t{r} * c.topk;
      const int32_t n = visible[r], valid = std::min(n, c.topk);
      std::vector<char> kept(n, 0);
      for (int32_t i = 0; i < c.topk; ++i) {
        if (i >= valid) {
          ASSERT_EQ(g[i], -1) << what << " slot " << i;
          continue;
        }
        ASSERT_TRUE(g[i] >= 0 && g[i] < n) << what << " slot " << i << " holds " << g[i];
        ASSERT_FALSE(kept[g[i]]) << what << " duplicate " << g[i];
        kept[g[i]] = 1;
      }
      if (n <= c.topk) continue;
      std::vector<float> sorted(x, x + n);
      std::nth_element(sorted.begin(), sorted.begin() + (c.topk - 1), sorted.end(), std::greater<>());
      const float kth = sorted[c.topk - 1];
      for (int32_t e = 0; e < n; ++e) {
        if (kept[e]) ASSERT_GE(x[e], kth) << what << ": kept entry " << e << " below the k-th";
        else ASSERT_LE(x[e], kth) << what << ": entry " << e << " above the k-th left out";
      }
    }
  }
  gpu::StreamDestroy(stream);
}

INSTANTIATE_TEST_SUITE_P(
    Routes, GpuTopkKernelTest,
    ::testing::Values(
        // one block per row, keys in shared memory
        TopkCase{"crowded", 5, 2000, 8192, 2048, true, 0},
        TopkCase{"ties", 5, 2040, 2060, 2048, true, 0},
        TopkCase{"equal", 3, 8000, 8192, 512, true, 0},
        TopkCase{"mixed", 70, 4000, 8192, 2048, true, 0},
        // one key more than k, and k = 1 (CachedSelect's tallies at both ends)
        TopkCase{"crowded", 4, 2049, 2049, 2048, true, 0},
        TopkCase{"mixed", 3, 2, 8192, 1, true, 0},
        // one block per row from global memory (no room for candidates)
        TopkCase{"crowded", 3, 20000, 40000, 2048, false, 1},
        TopkCase{"equal", 2, 9000, 9000, 100, false, 1},
        TopkCase{"mixed", 4, 9000, 32768, 2048, false, 1},
        // rows split over blocks
        TopkCase{"crowded", 1, 131072, 131072, 2048, true, 2},
        TopkCase{"ties", 8, 60000, 131072, 2048, true, 2},
        // the k-th key's bin holds ~6k candidates: stage C from shared memory
        TopkCase{"ties", 4, 40000, 60000, 2048, true, 2},
        TopkCase{"equal", 2, 20000, 40000, 2048, true, 2},
        TopkCase{"mixed", 64, 16384, 32768, 2048, true, 2},
        TopkCase{"crowded", 3, 1000, 70000, 1024, true, 2}),
    [](const auto& info) {
      const TopkCase& c = info.param;
      return std::string(c.dist) + "_B" + std::to_string(c.rows) + "_n" + std::to_string(c.n_max) +
             "_k" + std::to_string(c.topk) +
             (c.expect_route == 0 ? "_shared" : c.expect_route == 1 ? "_global" : "_split");
    });

// Stage B's register cap follows the launch's blocks per multiprocessor.
TEST(GpuTopkPlanTest, EmitCapByBlocksPerSm) {
  if (gpu::Knobs().topk_blocks_per_sm > 0) GTEST_SKIP() << "INDEXER_GPU_TOPK_BLOCKS_PER_SM is set";
  EXPECT_EQ(gpu::TopkEmitCap(264, 132), 1);
  EXPECT_EQ(gpu::TopkEmitCap(265, 132), 3);
  EXPECT_EQ(gpu::TopkEmitCap(396, 132), 3);
  EXPECT_EQ(gpu::TopkEmitCap(397, 132), 4);
  EXPECT_EQ(gpu::TopkEmitCap(100000, 0), 1);  // no device count: uncapped
  gpu::TopkParams tp{};
  gpu::PlanTopkSplit(128, 131072, 2048, 132, int64_t{128} * 131072, &tp);  // 16 slices x 128 rows
  EXPECT_EQ(tp.emit_cap, 4);
  gpu::PlanTopkSplit(2, 40000, 2048, 132, int64_t{2} * 40000, &tp);
  EXPECT_EQ(tp.emit_cap, 1);
}

// The by-rows top-k's block: 1024 threads up to one row per SM, else 512.
TEST(GpuTopkPlanTest, RowThreadsByRowsPerSm) {
  if (gpu::Knobs().topk_row_threads > 0) GTEST_SKIP() << "INDEXER_GPU_TOPK_ROW_THREADS is set";
  gpu::TopkParams tp{};
  gpu::PlanTopkSplit(132, 8192, 2048, 132, int64_t{132} * 8192, &tp);
  EXPECT_EQ(tp.cand_stride, 0);
  EXPECT_EQ(tp.row_threads, 1024);
  gpu::PlanTopkSplit(133, 8192, 2048, 132, int64_t{133} * 8192, &tp);
  EXPECT_EQ(tp.row_threads, 512);
  gpu::PlanTopkSplit(256, 8192, 2048, 132, int64_t{256} * 8192, &tp);
  EXPECT_EQ(tp.row_threads, 512);
}

TEST(GpuBackendTest, RejectsForeignPoolAndContext) {
  SKIP_WITHOUT_GPU();
  auto layout = *PageLayout::Make(KvFormat::kFp8, 128, 64);
  auto gpu = MakeGpuBackend(0, 0);
  ASSERT_TRUE(gpu.ok()) << gpu.status();
  const PoolHandle pool = *(*gpu)->AllocatePool(layout, 4);
  const StepRows rows = MakeStep({0}, {10}, {2}, 64, {{1}}, 0);
  const StepRows other = MakeStep({0, 0}, {10, 10}, {1, 1}, 64, {{1}, {2}}, 0);
  auto ctx = (*gpu)->PrepareStep(layout, other);
  ASSERT_TRUE(ctx.ok());
  std::vector<float> k(10 * 128, 1.f);
  KInput in;
  in.data = k.data();
  PoolHandle foreign = pool;
  foreign.index += 1;  // no such pool
  auto bad_pool = (*gpu)->WriteEntries(layout, foreign, rows, nullptr, in);
  EXPECT_EQ(bad_pool.status().code(), absl::StatusCode::kInvalidArgument);
  auto bad_ctx = (*gpu)->WriteEntries(layout, pool, rows, ctx->get(), in);
  EXPECT_EQ(bad_ctx.status().code(), absl::StatusCode::kInvalidArgument);
  const StepRows oob = MakeStep({0}, {10}, {2}, 64, {{9}}, 0);  // page 9 of 4
  EXPECT_EQ((*gpu)->WriteEntries(layout, pool, oob, nullptr, in).status().code(),
            absl::StatusCode::kInvalidArgument);
  // PrepareStep knows no pool: the page is refused by each call.
  auto oob_ctx = (*gpu)->PrepareStep(layout, oob);
  ASSERT_TRUE(oob_ctx.ok()) << oob_ctx.status();
  EXPECT_EQ((*gpu)->WriteEntries(layout, pool, oob, oob_ctx->get(), in).status().code(),
            absl::StatusCode::kInvalidArgument);
  EXPECT_EQ((*gpu)->ReadEntries(layout, pool, 4, 0, 1, nullptr).code(),
            absl::StatusCode::kInvalidArgument);
}

// Which MFMA kernel LaunchDenseLogits takes (host only, no GPU): the shapes
// the kernels take, per device; on CUDA only when a test or the env asks.
TEST(MfmaPathTest, SelectsWhatEachDeviceTakes) {
  gpu::LogitsParams p{};
  p.layout = *PageLayout::Make(KvFormat::kFp8, 128, 64);
  p.num_heads = 64;
  p.max_group_rows = 4;
  EXPECT_EQ(gpu::MfmaLogitsArch(p, 9, 0, gpu::kPathMfmaGfx942), 942);
  EXPECT_EQ(gpu::MfmaLogitsArch(p, 9, 0, gpu::kPathMfmaGfx950), 950);
  EXPECT_EQ(gpu::MfmaLogitsArch(p, 9, 4, 0), 0);  // portable asked for
  if (gpu::kRuntimeIsHip) {
    EXPECT_EQ(gpu::MfmaLogitsArch(p, 9, 4, 2), 942);
    EXPECT_EQ(gpu::MfmaLogitsArch(p, 9, 5, 1), 950);
    EXPECT_EQ(gpu::MfmaLogitsArch(p, 9, 0, 2), 0);  // gfx90a: no FP8 MFMA
  } else if (std::getenv("INDEXER_GPU_MFMA_MODEL") == nullptr) {
    EXPECT_EQ(gpu::MfmaLogitsArch(p, 9, 0, 2), 0);  // the H200 default stays wgmma
    EXPECT_EQ(gpu::MfmaLogitsArch(p, 9, 0, 1), 0);
  }
  EXPECT_STREQ(gpu::MfmaPathName(942), gpu::kRuntimeIsHip ? "mfma_gfx942" : "mfma_model_gfx942");
  // H 1..64 (zero-padded to whole 32-head tiles), D 128, groups of <= 4 rows.
  p.num_heads = 8;
  EXPECT_EQ(gpu::MfmaLogitsArch(p, 9, 0, gpu::kPathMfmaGfx942), 942);
  p.num_heads = 65;
  EXPECT_EQ(gpu::MfmaLogitsArch(p, 9, 0, gpu::kPathMfmaGfx942), 0);
  p.num_heads = 64;
  p.max_group_rows = gpu::kMaxGroupRows + 1;
  EXPECT_EQ(gpu::MfmaLogitsArch(p, 9, 0, gpu::kPathMfmaGfx942), 0);
  p.max_group_rows = 1;
  p.layout = *PageLayout::Make(KvFormat::kFp8, 64, 64);
  EXPECT_EQ(gpu::MfmaLogitsArch(p, 9, 0, gpu::kPathMfmaGfx942), 0);
  // MXFP4: the scaled FP4 MFMA of gfx950; gfx942 has none.
  p.layout = *PageLayout::Make(KvFormat::kMxfp4, 128, 64);
  EXPECT_EQ(gpu::MfmaLogitsArch(p, 9, 0, gpu::kPathMfmaGfx950), 950);
  EXPECT_EQ(gpu::MfmaLogitsArch(p, 9, 0, gpu::kPathMfmaGfx942), 0);
  EXPECT_FALSE(gpu::LaunchDenseLogitsMfma(p, 942, nullptr).ok());
}

// The kernels' host set-up (the dynamic shared-memory opt-in, blocks per
// SM) is per device (per_device.h): in one process, every device runs the
// tensor-core logits paths after device 0 has, and agrees with the cpu
// backend. (A process-wide once left device 1 without the opt-in.)
TEST(GpuBackendTest, EveryDeviceOfOneProcessRunsTheTensorCorePaths) {
  SKIP_WITHOUT_GPU();
  const int devices = GpuDeviceCount();
  if (devices < 2) GTEST_SKIP() << "one GPU: per-device kernel set-up needs a second device in the process";
  struct Config { KvFormat format; int32_t page_entries; int32_t q_len; };
  for (const Config c : {Config{KvFormat::kFp8, 64, 1}, Config{KvFormat::kFp8, 64, 4},
                         Config{KvFormat::kFp8, 16, 1}, Config{KvFormat::kMxfp4, 64, 1}}) {
    const auto layout = *PageLayout::Make(c.format, 128, c.page_entries);
    for (int d = 0; d < devices; ++d) {
      SCOPED_TRACE(absl::StrCat("device ", d, " format ", static_cast<int>(c.format), " page ", c.page_entries,
                                " q_len ", c.q_len));
      auto gpu = MakeGpuBackend(d, 0);
      ASSERT_TRUE(gpu.ok()) << gpu.status();
      CpuBackend cpu(0);
      std::mt19937 rng(11 + d);
      const int32_t seqs = 4, hist = 3000, topk = 128;
      const int32_t per = (hist + c.q_len + c.page_entries - 1) / c.page_entries;
      std::vector<std::vector<int32_t>> pages(seqs);
      for (int32_t s = 0; s < seqs; ++s)
        for (int32_t i = 0; i < per; ++i) pages[s].push_back(s * per + i);
      const PoolHandle cpool = *cpu.AllocatePool(layout, seqs * per);
      auto gp = (*gpu)->AllocatePool(layout, seqs * per);
      ASSERT_TRUE(gp.ok()) << gp.status();
      const std::vector<int32_t> total(seqs, hist + c.q_len), q(seqs, c.q_len);
      const StepRows rows = MakeStep(std::vector<int32_t>(seqs, 0), total, q, c.page_entries, pages, 0);
      KData k = MakeK(rng, layout, rows.NewEntries(), KInput::Kind::kFloat32, true);
      ASSERT_TRUE(cpu.WriteEntries(layout, cpool, rows, nullptr, k.input).ok());
      ASSERT_TRUE((*gpu)->WriteEntries(layout, *gp, rows, nullptr, k.input).ok());
      const QData qd = MakeQ(rng, layout, rows.num_rows, 64);
      std::vector<int32_t> got(rows.num_rows * topk);
      auto t = (*gpu)->DenseTopk(layout, *gp, rows, nullptr, qd.input, topk, got.data());
      ASSERT_TRUE(t.ok()) << t.status();
      const std::string path = static_cast<gpu::GpuBackend*>(gpu->get())->last_logits_path();
      std::printf("[   path   ] device %d: %s\n", d, path.c_str());
      EXPECT_NE(path, "portable") << "an sm_90 device takes a tensor-core path here";
      const PathTolerance tol = ToleranceFor(path, layout.format);
      Margin m;
      for (int32_t r = 0; r < rows.num_rows; ++r) {
        const RefRow ref = RefLogits(cpu, cpool, layout, rows, qd, r);
        ExpectTopkRow(got.data() + r * topk, rows.row_visible[r], topk, ref.logit, ref.Tol(tol),
                      "gpu (" + path + ") row " + std::to_string(r), &m);
        if (HasFatalFailure()) return;
      }
    }
  }
}

TEST(GpuBackendTest, DescribesDevice) {
  SKIP_WITHOUT_GPU();
  auto gpu = MakeGpuBackend(0, 0);
  ASSERT_TRUE(gpu.ok()) << gpu.status();
  EXPECT_EQ((*gpu)->Kind(), "gpu");
  EXPECT_NE((*gpu)->Describe().find(":0 "), std::string::npos) << (*gpu)->Describe();
  EXPECT_FALSE(MakeGpuBackend(GpuDeviceCount(), 0).ok());
}


}  // namespace
}  // namespace gpu_test
}  // namespace indexer

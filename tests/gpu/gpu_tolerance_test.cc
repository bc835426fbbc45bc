// The checks of the gpu tests themselves, host only (no GPU needed, so they
// run wherever the CUDA build does): the per-path tolerances catch a dropped
// head that the old shared bound let through, the cpu backend passes the set
// check under the fp32 bound, and the tensor-core bound covers a model of
// the accumulator it is derived for.
#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <random>
#include <string>
#include <vector>

#include "gtest/gtest.h"
#include "kernels/cpu/cpu_backend.h"
#include "tests/gpu/gpu_test_reference.h"

namespace indexer {
namespace gpu_test {
namespace {

// ---- the checker's power (host only: runs without a GPU) ----------------------
// One row of 4096 entries of this file's K and Q (64 heads), FP8 and MXFP4,
// scored in double. A kernel that loses head h of entry e scores it low by
// c = kscale * w_h * relu(q_h . k). For each path tolerance:
//   - the share of heads (c > 0) a pair check can see at all (c above the
//     entry's tolerance twice: it is compared with an entry of like size):
//     nearly all under the per-path bounds, far fewer under the old shared
//     2^-10 bound;
//   - an injected drop: an entry of the reference top-k whose lost head puts
//     it below the cut, chosen so that the old bound cannot tell; the top-k
//     of the damaged scores passes the checker under the old bound and fails
//     it under the path's bound.
struct DropStats {
  double seen_new = 0, seen_old = 0;  // shares of heads with c > 0
  bool injected = false;              // an entry and head found as described
  std::string new_verdict, old_verdict;
};

DropStats InjectDroppedHead(KvFormat format, const PathTolerance& t) {
  const PageLayout layout = *PageLayout::Make(format, 128, 64);
  std::mt19937 rng(format == KvFormat::kFp8 ? 11 : 12);
  const int32_t n = 4096, k = 512, heads = 64;
  const KData kd = MakeK(rng, layout, n, KInput::Kind::kQuantized, true);
  const QData q = MakeQ(rng, layout, 1, heads);
  const std::vector<double> qd = DecodeQRow(layout, q, 0);
  std::vector<double> logit(n), tol_new(n), tol_old(n), kv;
  double mag = 0, relu_mag = 0;
  std::vector<std::vector<double>> contrib(n);
  DropStats st;
  int64_t positive = 0;
  for (int32_t e = 0; e < n; ++e) {
    const uint8_t* entry = kd.quantized.data() + static_cast<int64_t>(e) * layout.entry_bytes();
    double kscale = 1;
    DecodeEntry(layout, entry, &kv, &kscale);
    logit[e] = EntryLogit(qd, q.weights.data(), heads, kv, kscale, &mag, &relu_mag, &contrib[e]);
    tol_new[e] = EntryTol(t, mag, relu_mag);
    tol_old[e] = EntryTol(kOldSharedTolerance, mag, relu_mag);
    for (double c : contrib[e]) {
      if (c == 0) continue;
      ++positive;
      st.seen_new += std::fabs(c) > 2 * tol_new[e];
      st.seen_old += std::fabs(c) > 2 * tol_old[e];
    }
  }
  st.seen_new /= std::max<int64_t>(positive, 1);
  st.seen_old /= std::max<int64_t>(positive, 1);

  std::vector<int32_t> order(n);
  for (int32_t i = 0; i < n; ++i) order[i] = i;
  std::sort(order.begin(), order.end(), [&](int32_t a, int32_t b) { return logit[a] > logit[b]; });
  const int32_t next = order[k];  // the best entry left out
  // The smallest head share that, lost, drops a top-k entry below `next`
  // where the new bound sees the gap and the old one does not.
  int32_t best_e = -1;
  double best_c = INFINITY;
  for (int32_t i = 0; i < k; ++i) {
    const int32_t e = order[i];
    const double gap = logit[e] - logit[next];
    if (gap <= tol_new[e] + tol_new[next] || gap > tol_old[e] + tol_old[next]) continue;
    for (double c : contrib[e]) {
      if (c > gap && c < best_c) best_c = c, best_e = e;
    }
  }
  if (best_e < 0) return st;
  st.injected = true;
  std::vector<double> damaged = logit;
  damaged[best_e] -= best_c;
  std::vector<int32_t> got(order);
  std::partial_sort(got.begin(), got.begin() + k, got.end(),
                    [&](int32_t a, int32_t b) { return damaged[a] > damaged[b]; });
  got.resize(k);
  st.new_verdict = TopkRowViolation(got.data(), n, k, logit, tol_new, nullptr);
  st.old_verdict = TopkRowViolation(got.data(), n, k, logit, tol_old, nullptr);
  return st;
}

TEST(GpuToleranceTest, PathBoundsCatchADroppedHeadTheSharedBoundMisses) {
  for (const KvFormat f : {KvFormat::kFp8, KvFormat::kMxfp4}) {
    const std::vector<std::string> paths =
        f == KvFormat::kFp8 ? std::vector<std::string>{"portable", "mma", "wgmma", "wgmma_ws"}
                            : std::vector<std::string>{"portable", "mma", "wgmma_mxfp4"};
    for (const std::string& path : paths) {
      const std::string what = (f == KvFormat::kFp8 ? "fp8 " : "mxfp4 ") + path;
      const DropStats st = InjectDroppedHead(f, ToleranceFor(path, f));
      std::printf("[  drops   ] %s: heads visible %.3f (path bound) vs %.3f (shared 2^-10)\n",
                  what.c_str(), st.seen_new, st.seen_old);
      // Heads no bound can see have a tiny weight or a dot near zero; the
      // shared bound missed half of the rest as well.
      EXPECT_GE(st.seen_new, 0.6) << what;
      EXPECT_LE(st.seen_old, 0.55) << what;
      ASSERT_TRUE(st.injected) << what << ": no entry and head to inject";
      EXPECT_NE(st.new_verdict, "") << what << ": the path bound let the dropped head through";
      EXPECT_EQ(st.old_verdict, "") << what << ": the old bound was expected to miss it";
    }
  }
}

// A call whose sub-chunks took several kernels is held to the loosest.
TEST(GpuToleranceTest, SeveralKernelsTakeTheLoosestBound) {
  EXPECT_EQ(ToleranceFor("mma", KvFormat::kMxfp4).dot_rel, kFp32Tolerance.dot_rel);
  EXPECT_EQ(ToleranceFor("mma", KvFormat::kFp8).dot_rel, kTensorCoreTolerance.dot_rel);
  EXPECT_EQ(ToleranceFor("mma+wgmma_mxfp4", KvFormat::kMxfp4).dot_rel, kTensorCoreTolerance.dot_rel);
  EXPECT_EQ(ToleranceFor("wgmma_mxfp4+mma", KvFormat::kMxfp4).dot_rel, kTensorCoreTolerance.dot_rel);
  EXPECT_EQ(ToleranceFor("portable+cpu", KvFormat::kFp8).dot_rel, kFp32Tolerance.dot_rel);
  EXPECT_LT(kTensorCoreTolerance.dot_rel, kOldSharedTolerance.dot_rel);
}

// The checks themselves on the cpu backend (host only): its fp32 top-k
// passes the set check under the fp32 bound on every row, FP8 and MXFP4,
// decode and prefill rows, so a failure on the device is the kernel's.
TEST(GpuToleranceTest, CpuBackendPassesTheSetCheckUnderTheFp32Bound) {
  for (const KvFormat f : {KvFormat::kFp8, KvFormat::kMxfp4}) {
    const PageLayout layout = *PageLayout::Make(f, 128, 64);
    CpuBackend cpu(0);
    std::mt19937 rng(f == KvFormat::kFp8 ? 21 : 22);
    const std::vector<int32_t> hist = {3000, 700, 5000}, q_lens = {1, 4, 20};
    std::vector<int32_t> new_e, zeros(hist.size(), 0);
    std::vector<std::vector<int32_t>> pages(hist.size());
    int32_t next = 0;
    for (size_t s = 0; s < hist.size(); ++s) {
      new_e.push_back(hist[s] + q_lens[s]);
      for (int32_t i = 0; i < PagesFor(new_e[s], 64); ++i) pages[s].push_back(next++);
    }
    const PoolHandle pool = *cpu.AllocatePool(layout, next);
    const StepRows rows = MakeStep(zeros, new_e, q_lens, 64, pages, 0);
    const KData kd = MakeK(rng, layout, rows.NewEntries(), KInput::Kind::kFloat32, true);
    ASSERT_TRUE(cpu.WriteEntries(layout, pool, rows, nullptr, kd.input).ok());
    const QData q = MakeQ(rng, layout, rows.num_rows, 64);
    const int32_t k = 256;
    std::vector<int32_t> got(static_cast<size_t>(rows.num_rows) * k, -7);
    ASSERT_TRUE(cpu.DenseTopk(layout, pool, rows, nullptr, q.input, k, got.data()).ok());
    Margin m;
    for (int32_t r = 0; r < rows.num_rows; ++r) {
      const RefRow ref = RefLogits(cpu, pool, layout, rows, q, r);
      ExpectTopkRow(got.data() + static_cast<int64_t>(r) * k, rows.row_visible[r], k, ref.logit,
                    ref.Tol(kFp32Tolerance), "cpu row " + std::to_string(r), &m);
      if (HasFatalFailure()) return;
    }
    m.Print(f == KvFormat::kFp8 ? "cpu fp8" : "cpu mxfp4");
  }
}

// The candidate check itself on the cpu backend (host only): its source and
// consumer pass under the fp32 bound on every row, and a consumer row with
// its best entry swapped for the best one it left out is caught.
TEST(GpuToleranceTest, CpuCandidateLayersPassTheConsumerCheck) {
  struct Case {
    KvFormat format;
    int32_t page_entries, block_size, topk_blocks, topk;
    bool pin;
    std::vector<int32_t> hist, q_lens;
  };
  const std::vector<Case> cases = {
      {KvFormat::kFp8, 64, 8, 64, 256, true, {3000, 1200, 40}, {1, 1, 3}},
      {KvFormat::kMxfp4, 16, 3, 50, 64, false, {700, 2000, 31}, {2, 2, 2}},
  };
  for (const Case& c : cases) {
    const PageLayout layout = *PageLayout::Make(c.format, 128, c.page_entries);
    CpuBackend cpu(0);
    std::mt19937 rng(41 + c.block_size);
    std::vector<int32_t> new_e, zeros(c.hist.size(), 0);
    std::vector<std::vector<int32_t>> pages(c.hist.size());
    int32_t next = 0;
    for (size_t s = 0; s < c.hist.size(); ++s) {
      new_e.push_back(c.hist[s] + c.q_lens[s]);
      for (int32_t i = 0; i < PagesFor(new_e[s], c.page_entries); ++i) pages[s].push_back(next++);
    }
    const PoolHandle pool = *cpu.AllocatePool(layout, next);
    const StepRows rows = MakeStep(zeros, new_e, c.q_lens, c.page_entries, pages, 0);
    const KData kd = MakeK(rng, layout, rows.NewEntries(), KInput::Kind::kFloat32, true);
    auto ctx = cpu.PrepareStep(layout, rows);
    ASSERT_TRUE(ctx.ok()) << ctx.status();
    ASSERT_TRUE(cpu.WriteEntries(layout, pool, rows, ctx->get(), kd.input).ok());
    CandidateSpec spec;
    spec.block_size = c.block_size;
    spec.topk_blocks = c.topk_blocks;
    spec.pin_newest = c.pin;
    const QData qs = MakeQ(rng, layout, rows.num_rows, 64), qc = MakeQ(rng, layout, rows.num_rows, 64);
    const int64_t k = c.topk;
    std::vector<int32_t> src(rows.num_rows * k), got(rows.num_rows * k, -7);
    ASSERT_TRUE(cpu.CandidateSource(layout, pool, rows, ctx->get(), qs.input, c.topk, spec, src.data()).ok());
    ASSERT_TRUE(cpu.CandidateConsumer(layout, pool, rows, ctx->get(), qc.input, c.topk, spec,
                                      ConsumerMode::kAuto, got.data()).ok());
    int32_t caught = 0, swapped = 0;
    for (int32_t r = 0; r < rows.num_rows; ++r) {
      const int32_t n = rows.row_visible[r];
      const std::string what = "row " + std::to_string(r) + " n " + std::to_string(n);
      const RefRow src_ref = RefLogits(cpu, pool, layout, rows, qs, r);
      const RefRow cons_ref = RefLogits(cpu, pool, layout, rows, qc, r);
      const std::vector<double> src_tol = src_ref.Tol(kFp32Tolerance), tol = cons_ref.Tol(kFp32Tolerance);
      ExpectTopkRow(src.data() + r * k, n, c.topk, src_ref.logit, src_tol, "source " + what);
      bool borderline = false;
      double used = 0;
      int32_t* row = got.data() + r * k;
      ASSERT_EQ(ConsumerRowViolation(row, n, c.topk, spec, src_ref.logit, src_tol, cons_ref.logit, tol,
                                     &borderline, &used),
                "")
          << "consumer " << what;
      // Damage: the best kept entry out, the best left-out entry of a block
      // that holds a kept one (surely in the pool) in.
      std::vector<char> kept(n, 0), block_used((n + c.block_size - 1) / c.block_size, 0);
      int32_t best = -1;
      for (int32_t i = 0; i < c.topk && row[i] >= 0; ++i) {
        kept[row[i]] = 1;
        block_used[row[i] / c.block_size] = 1;
        if (best < 0 || cons_ref.logit[row[i]] > cons_ref.logit[row[best]]) best = i;
      }
      int32_t in_e = -1;
      for (int32_t e = 0; e < n; ++e) {
        if (!kept[e] && block_used[e / c.block_size] && (in_e < 0 || cons_ref.logit[e] > cons_ref.logit[in_e])) {
          in_e = e;
        }
      }
      if (best < 0 || in_e < 0) continue;
      ++swapped;
      const int32_t keep = row[best];
      row[best] = in_e;
      caught += ConsumerRowViolation(row, n, c.topk, spec, src_ref.logit, src_tol, cons_ref.logit, tol,
                                     &borderline, &used) != "";
      row[best] = keep;
    }
    EXPECT_GT(swapped, 0);
    EXPECT_EQ(caught, swapped) << "damaged consumer rows passed the check";
  }
}

// The tensor-core bound against a model of the accumulator it is derived
// for (host only): each k32 step aligns its 32 products and the running
// sum to the largest exponent, truncates every addend to 13 bits below it,
// sums, and truncates the result to 13 fraction bits (fp22: 1, 8, 13) —
// more pessimistic than rounding. Over 8192 entries of this file's K and Q,
// FP8 and MXFP4, no logit of that model strays beyond a quarter of the
// bound, so the pair check (two tolerances) keeps a margin of 8.
double TruncTo(double x, int lsb_exp) {
  const double u = std::ldexp(1.0, lsb_exp);
  return std::trunc(x / u) * u;
}

double TruncatingAccumulatorDot(const double* q, const std::vector<double>& k) {
  constexpr int kBits = 13;
  double c = 0;
  for (int step = 0; step < 4; ++step) {
    double p[32], mx = std::fabs(c);
    for (int i = 0; i < 32; ++i) {
      const int d = i * 4 + step;  // some interleaving of D, like the kernels'
      p[i] = q[d] * k[d];
      mx = std::max(mx, std::fabs(p[i]));
    }
    if (mx == 0) continue;
    const int top = std::ilogb(mx);
    double s = TruncTo(c, top - kBits);
    for (int i = 0; i < 32; ++i) s += TruncTo(p[i], top - kBits);
    c = s == 0 ? 0 : TruncTo(s, std::ilogb(s) - kBits);
  }
  return c;
}

TEST(GpuToleranceTest, TensorCoreBoundCoversATruncatingFp22Accumulator) {
  for (const KvFormat f : {KvFormat::kFp8, KvFormat::kMxfp4}) {
    const PageLayout layout = *PageLayout::Make(f, 128, 64);
    std::mt19937 rng(f == KvFormat::kFp8 ? 31 : 32);
    const int32_t n = 8192, heads = 64;
    const KData kd = MakeK(rng, layout, n, KInput::Kind::kQuantized, true);
    const QData q = MakeQ(rng, layout, 1, heads);
    const std::vector<double> qd = DecodeQRow(layout, q, 0);
    std::vector<double> kv;
    double worst = 0;
    for (int32_t e = 0; e < n; ++e) {
      double kscale = 1, mag = 0, relu_mag = 0;
      DecodeEntry(layout, kd.quantized.data() + static_cast<int64_t>(e) * layout.entry_bytes(), &kv, &kscale);
      const double ref = EntryLogit(qd, q.weights.data(), heads, kv, kscale, &mag, &relu_mag);
      double model = 0;
      for (int32_t h = 0; h < heads; ++h) {
        model += q.weights[h] * std::max(TruncatingAccumulatorDot(qd.data() + h * 128, kv), 0.0);
      }
      model *= kscale;
      worst = std::max(worst, std::fabs(model - ref) / EntryTol(kTensorCoreTolerance, mag, relu_mag));
    }
    std::printf("[  fp22    ] %s: the model's worst logit used %.3f of the tensor-core bound\n",
                f == KvFormat::kFp8 ? "fp8" : "mxfp4", worst);
    EXPECT_GT(worst, 0) << "the model should round somewhere";
    EXPECT_LE(worst, 0.25);
  }
}

}  // namespace
}  // namespace gpu_test
}  // namespace indexer

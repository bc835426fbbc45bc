// The cpu backend against obviously-correct references: cache writes and
// reads are bit-exact against the codecs; dense top-k follows the SPEC §5
// correctness rule against a double-precision reference.
#include "kernels/cpu/cpu_backend.h"

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <memory>
#include <random>
#include <set>
#include <string>
#include <tuple>
#include <vector>

#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "kernels/backend.h"
#include "kernels/format/fp8.h"
#include "kernels/format/mxfp4.h"
#include "kernels/format/numeric.h"
#include "kernels/format/page_layout.h"

namespace indexer {
namespace {

using ::testing::HasSubstr;

constexpr int32_t kHeads = 3;  // odd: exercises the kernel's head tail
constexpr int32_t kTopk = 8;

// One sequence of the synthetic step, in tokens.
struct SeqPlan {
  int32_t old_tokens;
  int32_t q_len;
};

// The step's rows (SPEC §2) for `plans`, with a shuffled block table over
// `num_pages` physical pages and row chunks of at most `chunk_rows` rows.
// With `write_old`, the rows describe a write-only step that brings each
// sequence from 0 to its old entries.
StepRows BuildRows(const std::vector<SeqPlan>& plans, int32_t ratio,
                   int32_t page_entries, const std::vector<int32_t>& pages,
                   int32_t max_pages, bool write_old, int32_t chunk_rows) {
  // A write-only step holds no rows: it goes from old_tokens to old_tokens
  // with the cache filled from 0.
  std::vector<int64_t> old_t, q, cached;
  std::vector<std::vector<int32_t>> seq_pages;
  size_t next_page = 0;
  for (const SeqPlan& p : plans) {
    old_t.push_back(p.old_tokens);
    q.push_back(write_old ? 0 : p.q_len);
    cached.push_back(write_old ? 0 : p.old_tokens);
    const int64_t n = PagesForTokens(p.old_tokens + p.q_len, ratio, page_entries);
    seq_pages.emplace_back(pages.begin() + next_page, pages.begin() + next_page + n);
    next_page += n;
  }
  StepRows rows = BuildStepRowsFromPages(old_t, q, seq_pages, ratio, INT64_MAX, cached);
  EXPECT_EQ(rows.max_pages, max_pages);
  rows.chunks = EvenChunks(rows.num_rows, chunk_rows);

  return rows;
}

// The linear form (values then scales) of one entry, by the codecs alone.
std::vector<uint8_t> QuantizeEntry(const PageLayout& layout, const float* x,
                                   bool ue8m0) {
  std::vector<uint8_t> e(layout.entry_bytes());
  if (layout.format == KvFormat::kFp8) {
    const float s = QuantizeFp8Entry(x, layout.head_dim, ue8m0, e.data());
    std::memcpy(e.data() + layout.value_bytes(), &s, sizeof s);
  } else {
    QuantizeMxfp4(x, layout.head_dim, e.data(),
                  e.data() + layout.value_bytes());
  }
  return e;
}

// Decoded K of one linear entry and its scale (1 for MXFP4: folded in).
std::vector<double> DecodeEntry(const PageLayout& layout,
                                const std::vector<uint8_t>& e, double* scale) {
  std::vector<double> k(layout.head_dim);
  if (layout.format == KvFormat::kFp8) {
    for (int32_t d = 0; d < layout.head_dim; ++d) k[d] = DecodeE4m3(e[d]);
    float s;
    std::memcpy(&s, e.data() + layout.value_bytes(), sizeof s);
    *scale = s;
  } else {
    for (int32_t d = 0; d < layout.head_dim; ++d) {
      k[d] = Mxfp4Element(e.data(), e.data() + layout.value_bytes(), d);
    }
    *scale = 1.0;
  }
  return k;
}

uint16_t ToBf16(float x) {  // round to nearest even, finite inputs
  uint32_t u = FloatToBits(x);
  u += 0x7fffu + ((u >> 16) & 1u);
  return static_cast<uint16_t>(u >> 16);
}

using Param = std::tuple<KvFormat, bool /*tiled*/, int32_t /*page_entries*/,
                         int32_t /*batch*/, int32_t /*ratio*/>;

std::string ParamName(const testing::TestParamInfo<Param>& info) {
  const auto [format, tiled, e, batch, ratio] = info.param;
  return std::string(KvFormatName(format)) + (tiled ? "_tiled" : "_linear") +
         "_E" + std::to_string(e) + "_B" + std::to_string(batch) + "_r" +
         std::to_string(ratio);
}

class CpuBackendStepTest : public testing::TestWithParam<Param> {
 protected:
  static constexpr int32_t kDim = 96;  // 3 MXFP4 blocks, odd chunk counts

  void SetUp() override {
    const auto [format, tiled, e, batch, ratio] = GetParam();
    int32_t n_per_tile = 0, d_per_tile = 0, lanes = 1;
    if (tiled) {
      n_per_tile = e >= 16 ? e / 4 : e;
      d_per_tile = 16;
      lanes = format == KvFormat::kMxfp4 ? 3 : 1;
    }
    auto layout = PageLayout::Make(format, kDim, e, n_per_tile, d_per_tile,
                                   lanes);
    ASSERT_TRUE(layout.ok()) << layout.status();
    layout_ = *layout;
    backend_ = std::make_unique<CpuBackend>(2);
    rng_.seed(e * 1000 + batch * 10 + ratio + (tiled ? 7 : 0) +
              (format == KvFormat::kMxfp4 ? 100000 : 0));
  }

  float RandomK() {
    // Mixed magnitudes per element, with exact zeros now and then.
    std::uniform_int_distribution<int> pick(0, 15);
    const int p = pick(rng_);
    if (p == 0) return 0.0f;
    if (p == 1) return -0.0f;
    return std::ldexp(normal_(rng_), p - 8);
  }

  PageLayout layout_;
  std::unique_ptr<CpuBackend> backend_;
  std::mt19937 rng_;
  std::normal_distribution<float> normal_{0.0f, 1.0f};
};

TEST_P(CpuBackendStepTest, WriteReadAndDenseTopk) {
  const auto [format, tiled, page_entries, batch, ratio] = GetParam();
  const int32_t dim = layout_.head_dim;
  const bool ue8m0 = page_entries % 2 == 0;

  // Mixed decode (q_len 1-2) and prefill (q_len 3-40) sequences.
  std::vector<SeqPlan> plans(batch);
  std::uniform_int_distribution<int> old_len(0, 300), decode(1, 2),
      prefill(3, 40), coin(0, 2);
  int32_t total_pages = 0, max_pages = 0;
  for (SeqPlan& p : plans) {
    p.old_tokens = old_len(rng_);
    p.q_len = coin(rng_) == 0 ? prefill(rng_) : decode(rng_);
    const int32_t pages =
        static_cast<int32_t>(PagesForTokens(p.old_tokens + p.q_len, ratio, page_entries));
    total_pages += pages;
    max_pages = std::max(max_pages, pages);
  }
  const int32_t num_pages = total_pages + 5;
  std::vector<int32_t> pages(num_pages);
  for (int32_t i = 0; i < num_pages; ++i) pages[i] = i;
  std::shuffle(pages.begin(), pages.end(), rng_);
  auto pool_or = backend_->AllocatePool(layout_, num_pages);
  ASSERT_TRUE(pool_or.ok()) << pool_or.status();
  const PoolHandle pool = *pool_or;

  // Expected linear entries of every sequence, by position.
  std::vector<std::vector<std::vector<uint8_t>>> want(batch);

  // Step 1 (write only, fp32 K): every sequence's old entries.
  const StepRows before = BuildRows(plans, ratio, page_entries, pages,
                                    max_pages, /*write_old=*/true, 7);
  {
    std::vector<float> k(static_cast<size_t>(before.NewEntries()) * dim);
    for (float& v : k) v = RandomK();
    for (int32_t s = 0; s < batch; ++s) {
      for (int32_t i = before.seq_k_begin[s]; i < before.seq_k_begin[s + 1];
           ++i) {
        want[s].push_back(
            QuantizeEntry(layout_, k.data() + int64_t{i} * dim, ue8m0));
      }
    }
    auto ctx = backend_->PrepareStep(layout_, before);
    ASSERT_TRUE(ctx.ok()) << ctx.status();
    KInput in{KInput::Kind::kFloat32, k.data(), ue8m0};
    auto us = backend_->WriteEntries(layout_, pool, before, ctx->get(), in);
    ASSERT_TRUE(us.ok()) << us.status();
  }

  // Step 2 (bf16 K): the new entries, then the dense path.
  const StepRows step = BuildRows(plans, ratio, page_entries, pages,
                                  max_pages, /*write_old=*/false, 7);
  auto ctx = backend_->PrepareStep(layout_, step);
  ASSERT_TRUE(ctx.ok()) << ctx.status();
  {
    std::vector<uint16_t> k(static_cast<size_t>(step.NewEntries()) * dim);
    for (uint16_t& v : k) v = ToBf16(RandomK());
    std::vector<float> x(dim);
    for (int32_t s = 0; s < batch; ++s) {
      for (int32_t i = step.seq_k_begin[s]; i < step.seq_k_begin[s + 1]; ++i) {
        for (int32_t d = 0; d < dim; ++d) {
          x[d] = Bf16ToFloat(k[int64_t{i} * dim + d]);
        }
        want[s].push_back(QuantizeEntry(layout_, x.data(), ue8m0));
      }
      ASSERT_EQ(static_cast<int32_t>(want[s].size()),
                step.seq_new_entries[s]);
    }
    KInput in{KInput::Kind::kBf16, k.data(), ue8m0};
    auto us = backend_->WriteEntries(layout_, pool, step, ctx->get(), in);
    ASSERT_TRUE(us.ok()) << us.status();
  }

  // Read back, entry by entry and one whole page at a time.
  std::vector<uint8_t> got(layout_.entry_bytes());
  for (int32_t s = 0; s < batch; ++s) {
    for (int32_t pos = 0; pos < step.seq_new_entries[s]; ++pos) {
      ASSERT_TRUE(backend_
                      ->ReadEntries(layout_, pool,
                                    step.Page(s, pos / page_entries),
                                    pos % page_entries, 1, got.data())
                      .ok());
      ASSERT_EQ(got, want[s][pos]) << "sequence " << s << " entry " << pos;
    }
    if (step.seq_new_entries[s] >= page_entries) {
      std::vector<uint8_t> page(layout_.page_bytes());
      ASSERT_TRUE(backend_
                      ->ReadEntries(layout_, pool, step.Page(s, 0), 0,
                                    page_entries, page.data())
                      .ok());
      for (int32_t e = 0; e < page_entries; ++e) {
        ASSERT_TRUE(std::equal(want[s][e].begin(), want[s][e].end(),
                               page.begin() + int64_t{e} *
                                                  layout_.entry_bytes()));
      }
    }
  }

  // Queries and weights, quantized as the daemon's callers do.
  const int32_t nr = step.num_rows;
  const int32_t vb = layout_.value_bytes(), sb = dim / 32;
  std::vector<uint8_t> qv(static_cast<size_t>(nr) * kHeads * vb);
  std::vector<uint8_t> qs(static_cast<size_t>(nr) * kHeads * sb);
  std::vector<float> w(static_cast<size_t>(nr) * kHeads);
  std::uniform_real_distribution<float> uw(-0.5f, 1.0f);
  std::vector<float> x(dim);
  for (int64_t rh = 0; rh < int64_t{nr} * kHeads; ++rh) {
    for (float& v : x) v = normal_(rng_);
    float scale = 1.0f;
    if (format == KvFormat::kFp8) {
      scale = QuantizeFp8Q(x.data(), dim, qv.data() + rh * vb);
    } else {
      QuantizeMxfp4(x.data(), dim, qv.data() + rh * vb, qs.data() + rh * sb);
    }
    w[rh] = uw(rng_) * scale;
  }
  QInput q;
  q.num_heads = kHeads;
  q.values = qv.data();
  q.scales = format == KvFormat::kMxfp4 ? qs.data() : nullptr;
  q.weights = w.data();
  std::vector<int32_t> out(static_cast<size_t>(nr) * kTopk, -7);
  auto timings = backend_->DenseTopk(layout_, pool, step, ctx->get(), q,
                                     kTopk, out.data());
  ASSERT_TRUE(timings.ok()) << timings.status();
  EXPECT_GE(timings->logits_us, 0);
  EXPECT_GE(timings->topk_us, 0);

  // The reference: double precision from the codecs' own bytes.
  for (int32_t r = 0; r < nr; ++r) {
    const int32_t s = step.row_seq[r], n = step.row_visible[r];
    std::vector<double> qd(static_cast<size_t>(kHeads) * dim);
    for (int32_t h = 0; h < kHeads; ++h) {
      const int64_t rh = int64_t{r} * kHeads + h;
      for (int32_t d = 0; d < dim; ++d) {
        qd[h * dim + d] =
            format == KvFormat::kFp8
                ? DecodeE4m3(qv[rh * vb + d])
                : Mxfp4Element(qv.data() + rh * vb, qs.data() + rh * sb, d);
      }
    }
    std::vector<double> score(n), magnitude(n);
    double tol = 1e-30;
    for (int32_t e = 0; e < n; ++e) {
      double kscale;
      const std::vector<double> k = DecodeEntry(layout_, want[s][e], &kscale);
      double sum = 0, mag = 0;
      for (int32_t h = 0; h < kHeads; ++h) {
        double dot = 0, adot = 0;
        for (int32_t d = 0; d < dim; ++d) {
          dot += qd[h * dim + d] * k[d];
          adot += std::fabs(qd[h * dim + d] * k[d]);
        }
        const double wh = w[int64_t{r} * kHeads + h];
        sum += wh * std::max(dot, 0.0);
        mag += std::fabs(wh) * adot;
      }
      score[e] = kscale * sum;
      tol = std::max(tol, 1e-5 * kscale * mag);
    }
    const int32_t* row = out.data() + int64_t{r} * kTopk;
    const int32_t count = std::min(n, kTopk);
    std::set<int32_t> seen;
    for (int32_t i = 0; i < kTopk; ++i) {
      if (i >= count) {
        ASSERT_EQ(row[i], -1) << "row " << r << " slot " << i;
        continue;
      }
      ASSERT_GE(row[i], 0) << "row " << r << " slot " << i;
      ASSERT_LT(row[i], n) << "row " << r << " slot " << i;
      ASSERT_TRUE(seen.insert(row[i]).second) << "duplicate in row " << r;
    }
    if (n <= kTopk) continue;
    std::vector<double> sorted = score;
    std::nth_element(sorted.begin(), sorted.begin() + (kTopk - 1),
                     sorted.end(), std::greater<double>());
    const double kth = sorted[kTopk - 1];
    for (int32_t i = 0; i < count; ++i) {
      EXPECT_GE(score[row[i]], kth - tol)
          << "row " << r << " index " << row[i] << " of " << n;
    }
  }
}

INSTANTIATE_TEST_SUITE_P(
    Geometries, CpuBackendStepTest,
    testing::Combine(testing::Values(KvFormat::kFp8, KvFormat::kMxfp4),
                     testing::Bool(), testing::Values(1, 3, 16, 64),
                     testing::Values(1, 5, 23), testing::Values(1, 4)),
    ParamName);

// One long row (batch 1) split over many tasks, D = 128 and 64 heads: the
// production shape of the decode path, at 12k entries.
TEST(CpuBackendTest, LongSingleRowMatchesReference) {
  auto layout = PageLayout::Make(KvFormat::kFp8, 128, 64);
  ASSERT_TRUE(layout.ok());
  CpuBackend backend(0);
  const int32_t entries = 12345, heads = 64, topk = 512;
  const int32_t pages = (entries + 63) / 64;
  auto pool = backend.AllocatePool(*layout, pages);
  ASSERT_TRUE(pool.ok());
  StepRows rows;
  rows.num_seqs = 1;
  rows.num_rows = 1;
  rows.seq_row_begin = {0, 1};
  rows.seq_old_entries = {0};
  rows.seq_new_entries = {entries};
  rows.seq_k_begin = {0, entries};
  rows.row_visible = {entries};
  rows.row_seq = {0};
  rows.max_visible = entries;
  rows.max_pages = pages;
  for (int32_t p = 0; p < pages; ++p) rows.block_table.push_back(pages - 1 - p);
  rows.chunks = {{0, 1}};
  std::mt19937 rng(5);
  std::normal_distribution<float> normal;
  std::vector<float> k(static_cast<size_t>(entries) * 128);
  for (float& v : k) v = normal(rng);
  ASSERT_TRUE(backend
                  .WriteEntries(*layout, *pool, rows, nullptr,
                                {KInput::Kind::kFloat32, k.data(), true})
                  .ok());
  std::vector<uint8_t> qv(heads * 128);
  std::vector<float> w(heads);
  std::vector<float> x(128);
  for (int32_t h = 0; h < heads; ++h) {
    for (float& v : x) v = normal(rng);
    w[h] = std::fabs(normal(rng)) *
           QuantizeFp8Q(x.data(), 128, qv.data() + h * 128);
  }
  QInput q{heads, qv.data(), nullptr, w.data()};
  std::vector<int32_t> out(topk);
  auto t = backend.DenseTopk(*layout, *pool, rows, nullptr, q, topk,
                             out.data());
  ASSERT_TRUE(t.ok()) << t.status();

  std::vector<double> score(entries);
  std::vector<uint8_t> codes(128);
  double tol = 0;
  for (int32_t e = 0; e < entries; ++e) {
    const float s = QuantizeFp8Entry(k.data() + int64_t{e} * 128, 128, true,
                                     codes.data());
    double sum = 0, mag = 0;
    for (int32_t h = 0; h < heads; ++h) {
      double dot = 0, adot = 0;
      for (int32_t d = 0; d < 128; ++d) {
        const double p = double{DecodeE4m3(qv[h * 128 + d])} *
                         DecodeE4m3(codes[d]);
        dot += p;
        adot += std::fabs(p);
      }
      sum += w[h] * std::max(dot, 0.0);
      mag += std::fabs(w[h]) * adot;
    }
    score[e] = s * sum;
    tol = std::max(tol, 1e-5 * s * mag);
  }
  std::vector<double> sorted = score;
  std::nth_element(sorted.begin(), sorted.begin() + topk - 1, sorted.end(),
                   std::greater<double>());
  std::set<int32_t> seen(out.begin(), out.end());
  EXPECT_EQ(seen.size(), static_cast<size_t>(topk));
  for (int32_t i : out) {
    ASSERT_GE(i, 0);
    ASSERT_LT(i, entries);
    EXPECT_GE(score[i], sorted[topk - 1] - tol) << i;
  }
}

class CpuBackendErrorTest : public testing::Test {
 protected:
  void SetUp() override {
    layout_ = *PageLayout::Make(KvFormat::kMxfp4, 64, 4);
    pool_ = *backend_.AllocatePool(layout_, 3);
    rows_.num_seqs = 1;
    rows_.num_rows = 1;
    rows_.seq_row_begin = {0, 1};
    rows_.seq_old_entries = {0};
    rows_.seq_new_entries = {6};
    rows_.seq_k_begin = {0, 6};
    rows_.row_visible = {6};
    rows_.row_seq = {0};
    rows_.max_visible = 6;
    rows_.max_pages = 2;
    rows_.block_table = {2, 0};
    rows_.chunks = {{0, 1}};
  }
  CpuBackend backend_{1};
  PageLayout layout_;
  PoolHandle pool_;
  StepRows rows_;
};

TEST_F(CpuBackendErrorTest, QuantizedEntriesAreCopiedVerbatim) {
  std::vector<uint8_t> k(6 * layout_.entry_bytes());
  for (size_t i = 0; i < k.size(); ++i) k[i] = static_cast<uint8_t>(i * 7);
  ASSERT_TRUE(backend_
                  .WriteEntries(layout_, pool_, rows_, nullptr,
                                {KInput::Kind::kQuantized, k.data(), true})
                  .ok());
  std::vector<uint8_t> got(4 * layout_.entry_bytes());
  ASSERT_TRUE(backend_.ReadEntries(layout_, pool_, 2, 0, 4, got.data()).ok());
  EXPECT_TRUE(std::equal(got.begin(), got.end(), k.begin()));
  ASSERT_TRUE(backend_.ReadEntries(layout_, pool_, 0, 0, 2, got.data()).ok());
  EXPECT_TRUE(std::equal(got.begin(), got.begin() + 2 * layout_.entry_bytes(),
                         k.begin() + 4 * layout_.entry_bytes()));
}

TEST_F(CpuBackendErrorTest, BadPageIsRejectedAndNothingIsWritten) {
  rows_.block_table = {2, 3};  // page 3 is outside the 3-page pool
  std::vector<float> k(6 * 64, 1.0f);
  auto st = backend_.WriteEntries(layout_, pool_, rows_, nullptr,
                                  {KInput::Kind::kFloat32, k.data(), true});
  ASSERT_FALSE(st.ok());
  EXPECT_EQ(st.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(std::string(st.status().message()), HasSubstr("block_table[0][1]"));
  std::vector<uint8_t> page(layout_.page_bytes());
  ASSERT_TRUE(backend_.ReadEntries(layout_, pool_, 2, 0, 4, page.data()).ok());
  EXPECT_TRUE(std::all_of(page.begin(), page.end(),
                          [](uint8_t b) { return b == 0; }));
}

TEST_F(CpuBackendErrorTest, InconsistentRowsAreRejected) {
  rows_.row_visible = {7};  // more than the sequence holds
  EXPECT_THAT(std::string(
                  backend_.PrepareStep(layout_, rows_).status().message()),
              HasSubstr("row_visible[0]"));
  rows_.row_visible = {6};
  rows_.seq_k_begin = {0, 5};
  EXPECT_FALSE(backend_.PrepareStep(layout_, rows_).ok());
}

TEST_F(CpuBackendErrorTest, ReadOutsideThePageIsRejected) {
  std::vector<uint8_t> got(8 * layout_.entry_bytes());
  EXPECT_FALSE(backend_.ReadEntries(layout_, pool_, 3, 0, 1, got.data()).ok());
  EXPECT_FALSE(backend_.ReadEntries(layout_, pool_, 0, 2, 3, got.data()).ok());
  // Handles that name no pool of this backend: another backend's, a stale
  // index, a forged base.
  CpuBackend another(1);
  const PoolHandle theirs = *another.AllocatePool(layout_, 3);
  EXPECT_FALSE(backend_.ReadEntries(layout_, theirs, 0, 0, 1, got.data()).ok());
  PoolHandle stale = pool_;
  stale.index = 5;
  EXPECT_FALSE(backend_.ReadEntries(layout_, stale, 0, 0, 1, got.data()).ok());
  PoolHandle forged = pool_;
  forged.base += 64;
  EXPECT_FALSE(backend_.ReadEntries(layout_, forged, 0, 0, 1, got.data()).ok());
  EXPECT_TRUE(backend_.ReadEntries(layout_, pool_, 0, 0, 1, got.data()).ok());
}

TEST_F(CpuBackendErrorTest, ZeroVisibleRowsGetMinusOne) {
  rows_.row_visible = {0};
  std::vector<uint8_t> qv(32), qs(2, 127);
  float w = 1.0f;
  QInput q{1, qv.data(), qs.data(), &w};
  int32_t out[3] = {5, 5, 5};
  ASSERT_TRUE(
      backend_.DenseTopk(layout_, pool_, rows_, nullptr, q, 3, out).ok());
  EXPECT_THAT(out, testing::ElementsAre(-1, -1, -1));
}

TEST(MakeBackendTest, DeviceStrings) {
  auto cpu = MakeBackend("cpu", 3);
  ASSERT_TRUE(cpu.ok()) << cpu.status();
  EXPECT_EQ((*cpu)->Kind(), "cpu");
  EXPECT_EQ((*cpu)->Describe(), "cpu (3 threads)");
  auto any = MakeBackend("auto");
  ASSERT_TRUE(any.ok()) << any.status();
#ifndef INDEXER_HAVE_GPU
  EXPECT_EQ((*any)->Kind(), "cpu");
  auto gpu = MakeBackend("gpu:0");
  ASSERT_FALSE(gpu.ok());
  EXPECT_THAT(std::string(gpu.status().message()), HasSubstr("GPU=OFF"));
#endif
  for (const char* bad : {"tpu", "gpu:", "gpu:x", "gpu:-1", "CPU", ""}) {
    auto b = MakeBackend(bad);
    ASSERT_FALSE(b.ok()) << bad;
    EXPECT_EQ(b.status().code(), absl::StatusCode::kInvalidArgument);
    EXPECT_THAT(std::string(b.status().message()), HasSubstr("device:"));
    EXPECT_THAT(std::string(b.status().message()), HasSubstr("gpu:N"));
  }
  EXPECT_FALSE(MakeBackend("cpu", -1).ok());
}

}  // namespace
}  // namespace indexer

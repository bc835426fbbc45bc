// Shared by the gpu backend tests: their inputs (K, Q, steps), the float64
// reference of the dense logits, each logits path's tolerance (derived next
// to it) and the SPEC §5 set check of a top-k row against the reference.
#ifndef INDEXER_TESTS_GPU_GPU_TEST_REFERENCE_H_
#define INDEXER_TESTS_GPU_GPU_TEST_REFERENCE_H_

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <random>
#include <string>
#include <utility>
#include <vector>

#include "gtest/gtest.h"
#include "kernels/backend.h"
#include "kernels/cpu/cpu_backend.h"
#include "kernels/format/fp8.h"
#include "kernels/format/mxfp4.h"
#include "kernels/format/numeric.h"
#include "kernels/geometry/step_geometry.h"

namespace indexer {
namespace gpu_test {

// A step over `lens` (entries after the step) with `q_lens` rows each;
// pages drawn from a shuffled pool so block tables are not contiguous.
inline StepRows MakeStep(const std::vector<int32_t>& old_e,
                  const std::vector<int32_t>& new_e,
                  const std::vector<int32_t>& q_lens, int32_t page_entries,
                  const std::vector<std::vector<int32_t>>& pages,
                  int32_t chunk_rows) {
  // Entries at ratio 1: the sequence holds new_e tokens after the step, its
  // rows are its last q_len positions and it writes entries after old_e.
  std::vector<int64_t> old_t, q, cached;
  for (size_t s = 0; s < new_e.size(); ++s) {
    old_t.push_back(new_e[s] - q_lens[s]);
    q.push_back(q_lens[s]);
    cached.push_back(old_e[s]);
  }
  StepRows r = BuildStepRowsFromPages(old_t, q, pages, 1, INT64_MAX, cached);
  r.chunks = chunk_rows > 0 ? EvenChunks(r.num_rows, chunk_rows)
                            : std::vector<std::pair<int32_t, int32_t>>{};

  return r;
}

inline std::vector<float> RandomK(std::mt19937& rng, int64_t n, int32_t dim) {
  std::normal_distribution<float> nd(0.f, 1.f);
  std::uniform_int_distribution<int> mag(-6, 6);
  std::vector<float> k(static_cast<size_t>(n * dim));
  for (int64_t i = 0; i < n; ++i) {
    const float m = std::ldexp(1.f, mag(rng));  // per-entry magnitude
    for (int32_t d = 0; d < dim; ++d) k[i * dim + d] = nd(rng) * m;
  }
  return k;
}

struct KData {
  std::vector<float> f32;
  std::vector<uint16_t> bf16;
  std::vector<uint8_t> quantized;
  KInput input;
};

inline KData MakeK(std::mt19937& rng, const PageLayout& layout, int64_t n,
            KInput::Kind kind, bool ue8m0) {
  KData d;
  d.f32 = RandomK(rng, n, layout.head_dim);
  d.input.kind = kind;
  d.input.ue8m0 = ue8m0;
  if (kind == KInput::Kind::kFloat32) {
    d.input.data = d.f32.data();
  } else if (kind == KInput::Kind::kBf16) {
    d.bf16.resize(d.f32.size());
    for (size_t i = 0; i < d.f32.size(); ++i) d.bf16[i] = static_cast<uint16_t>(FloatToBits(d.f32[i]) >> 16);
    d.input.data = d.bf16.data();
  } else {
    const int32_t eb = layout.entry_bytes(), vb = layout.value_bytes();
    d.quantized.resize(static_cast<size_t>(n * eb));
    for (int64_t i = 0; i < n; ++i) {
      uint8_t* e = d.quantized.data() + i * eb;
      const float* x = d.f32.data() + i * layout.head_dim;
      if (layout.format == KvFormat::kFp8) {
        const float s = QuantizeFp8Entry(x, layout.head_dim, ue8m0, e, layout.fp8);
        std::memcpy(e + vb, &s, 4);
      } else {
        QuantizeMxfp4(x, layout.head_dim, e, e + vb);
      }
    }
    d.input.data = d.quantized.data();
  }
  return d;
}

struct QData {
  std::vector<uint8_t> values, scales;
  std::vector<float> weights;
  QInput input;
};

inline QData MakeQ(std::mt19937& rng, const PageLayout& layout, int32_t rows, int32_t heads) {
  QData q;
  std::uniform_int_distribution<int> byte(0, 255);
  std::uniform_real_distribution<float> w(-1.f, 1.f);
  const int64_t n = static_cast<int64_t>(rows) * heads;
  q.values.resize(static_cast<size_t>(n * layout.value_bytes()));
  for (auto& v : q.values) {
    uint8_t b = static_cast<uint8_t>(byte(rng));
    if (layout.format == KvFormat::kFp8 && IsFp8Nan(layout.fp8, b)) b ^= 1;  // no NaN
    v = b;
  }
  if (layout.format == KvFormat::kMxfp4) {
    std::uniform_int_distribution<int> e(124, 130);
    q.scales.resize(static_cast<size_t>(n * (layout.head_dim / 32)));
    for (auto& s : q.scales) s = static_cast<uint8_t>(e(rng));
  }
  q.weights.resize(static_cast<size_t>(n));
  for (auto& x : q.weights) x = w(rng) / 64.f;
  q.input.num_heads = heads;
  q.input.values = q.values.data();
  q.input.scales = q.scales.empty() ? nullptr : q.scales.data();
  q.input.weights = q.weights.data();
  return q;
}

// ---- per-path tolerances -----------------------------------------------------
// A GPU logit may differ from the float64 reference by its arithmetic's
// rounding; the bound for entry e of row r, over heads h and dims d, is
//   tol[e] = kscale[e] * (dot_rel * sum_h |w_h| * S_h + sum_rel * sum_h |w_h| * relu(dot_h))
// with S_h = sum_d |q_hd * k_d| (the magnitude the dot product's error
// scales with) and dot_h = q_h . k. Every product q_hd * k_d is exact in
// fp32 (e4m3 x e4m3: 4-bit significands; MXFP4: e2m1 widened exactly, powers
// of two as block scales), so only the sums round:
//   - the dot product, D = 128 terms: dot_rel;
//   - w_h * relu(dot_h) (one rounding), the H-term head sum and the product
//     with kscale, always fp32 on CUDA cores: at most (H + 2) * 2^-24 of
//     sum_h |w_h| * relu(dot_h), under 2^-17 for H = 64; sum_rel = 2^-16
//     on every path (any H <= 128 fits).
struct PathTolerance {
  double dot_rel;
  double sum_rel;
};

// fp32 on CUDA cores (portable; the cpu backend; MXFP4 mma.sync, whose
// per-block partials are exact in the tensor core and whose four blocks are
// summed in fp32 registers): any order of D = 128 fp32 additions errs by at
// most gamma_128 = 128 * 2^-24 = 2^-17 of S_h; doubled for slack.
constexpr PathTolerance kFp32Tolerance{1.0 / 65536, 1.0 / 65536};  // 2^-16, 2^-16

// The tensor-core accumulator (FP8 mma.sync and wgmma; MXFP4 wgmma's fast
// route, which sums its four exact block partials in the accumulator): on
// sm_89/sm_90 FP8 MMA adds its products into the fp32 accumulator with about
// 14 significant bits (operands aligned to the largest exponent, the rest
// truncated; cf. DeepSeek-V3 §3.3.2), i.e. up to 2^-13 of the largest addend
// per aligned addend. With D = 128 in four k32 steps the realistic error of
// one dot is a few units of 2^-13 of the step's largest magnitude, which is
// at most S_h; the head sum then mixes these errors with weights of random
// sign. dot_rel = 2^-12 keeps that with room while staying 4x under the
// old shared 2^-10, so that one head's w_h * relu(dot_h) is seen (see
// GpuToleranceTest): the shared bound was about the size of a typical
// head's contribution for the 64-head Q of these tests.
constexpr PathTolerance kTensorCoreTolerance{1.0 / 4096, 1.0 / 65536};  // 2^-12, 2^-16

// The shared bound every path used before (2^-10 of sum_h |w_h| * S_h): kept
// only to show in GpuToleranceTest what it let through.
constexpr PathTolerance kOldSharedTolerance{1.0 / 1024, 0.0};  // 2^-10

// The tolerance of the logits path `path` (GpuBackend::last_logits_path(),
// or "cpu") for `format`; of several kernels ('+'-joined: a call whose
// sub-chunks took different kernels), the loosest.
inline PathTolerance ToleranceFor(const std::string& path, KvFormat format) {
  PathTolerance t{0, 0};
  size_t begin = 0;
  while (begin <= path.size()) {
    const size_t end = std::min(path.find('+', begin), path.size());
    const std::string one = path.substr(begin, end - begin);
    PathTolerance o = kOldSharedTolerance;
    if (one == "portable" || one == "cpu") {
      o = kFp32Tolerance;
    } else if (one == "mma") {
      o = format == KvFormat::kMxfp4 ? kFp32Tolerance : kTensorCoreTolerance;
    } else if (one == "wgmma" || one == "wgmma_ws" || one == "wgmma_mxfp4" || one == "wgmma_gather" ||
               one == "wgmma_ws_gather" || one == "wgmma_mxfp4_gather") {
      o = kTensorCoreTolerance;
    } else if (one == "mfma_model_gfx942" || one == "mfma_model_gfx950") {
      // The MFMA kernels on the instruction model: exact products, fp32 sums
      // (kernels/gpu/amd/mfma_model.h).
      o = kFp32Tolerance;
    } else if (one == "mfma_gfx942" || one == "mfma_gfx950") {
      // AMD matrix cores: their internal accumulation width is not
      // documented; until measured on MI300 / MI355 hardware, the tensor-core
      // bound (nothing has run on AMD hardware yet).
      o = kTensorCoreTolerance;
    } else {
      ADD_FAILURE() << "no tolerance for logits path '" << one << "' (of '" << path << "')";
    }
    t.dot_rel = std::max(t.dot_rel, o.dot_rel);
    t.sum_rel = std::max(t.sum_rel, o.sum_rel);
    begin = end + 1;
  }
  return t;
}

// Decoded Q of one row: [H, D] in double.
inline std::vector<double> DecodeQRow(const PageLayout& layout, const QData& q, int32_t r) {
  const int32_t dim = layout.head_dim, heads = q.input.num_heads, vb = layout.value_bytes();
  std::vector<double> qd(static_cast<size_t>(heads) * dim);
  for (int32_t h = 0; h < heads; ++h) {
    const int64_t qh = static_cast<int64_t>(r) * heads + h;
    for (int32_t d = 0; d < dim; ++d) {
      qd[h * dim + d] = layout.format == KvFormat::kFp8
                            ? DecodeFp8(layout.fp8, q.values[qh * vb + d])
                            : Mxfp4Element(q.values.data() + qh * vb, q.scales.data() + qh * (dim / 32), d);
    }
  }
  return qd;
}

// One entry's decoded K (double) and its kscale (1 for MXFP4).
inline void DecodeEntry(const PageLayout& layout, const uint8_t* entry, std::vector<double>* k, double* kscale) {
  const int32_t dim = layout.head_dim, vb = layout.value_bytes();
  k->resize(dim);
  for (int32_t d = 0; d < dim; ++d) {
    (*k)[d] = layout.format == KvFormat::kFp8 ? DecodeFp8(layout.fp8, entry[d]) : Mxfp4Element(entry, entry + vb, d);
  }
  float s = 1.f;
  if (layout.format == KvFormat::kFp8) std::memcpy(&s, entry + vb, 4);
  *kscale = s;
}

// The reference logit of one entry in double; *mag and *relu_mag receive
// kscale * sum_h |w_h| * S_h and kscale * sum_h |w_h| * relu(dot_h) (the
// terms of its tolerance, see PathTolerance); `contrib` (if set) each head's
// share kscale * w_h * relu(dot_h), what a kernel that lost that head misses.
inline double EntryLogit(const std::vector<double>& qd, const float* w, int32_t heads,
                  const std::vector<double>& k, double kscale, double* mag, double* relu_mag,
                  std::vector<double>* contrib = nullptr) {
  if (contrib != nullptr) contrib->assign(heads, 0.0);
  const int32_t dim = static_cast<int32_t>(k.size());
  double sum = 0, m = 0, rm = 0;
  for (int32_t h = 0; h < heads; ++h) {
    double dot = 0, absdot = 0;
    for (int32_t d = 0; d < dim; ++d) {
      dot += qd[h * dim + d] * k[d];
      absdot += std::fabs(qd[h * dim + d] * k[d]);
    }
    const double wh = w[h];
    sum += wh * std::max(dot, 0.0);
    m += std::fabs(wh) * absdot;
    rm += std::fabs(wh) * std::max(dot, 0.0);
    if (contrib != nullptr) (*contrib)[h] = kscale * wh * std::max(dot, 0.0);
  }
  *mag = std::fabs(kscale) * m;
  *relu_mag = std::fabs(kscale) * rm;
  return sum * kscale;
}

// An entry's tolerance under `t` from EntryLogit's terms (1e-30: entries
// whose every product is zero).
inline double EntryTol(const PathTolerance& t, double mag, double relu_mag) {
  return t.dot_rel * mag + t.sum_rel * relu_mag + 1e-30;
}

// One row's reference: logits and the terms of their tolerances.
struct RefRow {
  std::vector<double> logit, mag, relu_mag;
  std::vector<double> Tol(const PathTolerance& t) const {
    std::vector<double> tol(logit.size());
    for (size_t e = 0; e < tol.size(); ++e) tol[e] = EntryTol(t, mag[e], relu_mag[e]);
    return tol;
  }
};

// Reference of row r, entries read back from the cpu pool.
inline RefRow RefLogits(CpuBackend& cpu, PoolHandle cpu_pool, const PageLayout& layout,
                 const StepRows& rows, const QData& q, int32_t r) {
  const int32_t n = rows.row_visible[r], s = rows.row_seq[r];
  const int32_t heads = q.input.num_heads;
  RefRow ref;
  ref.logit.assign(n, 0.0);
  ref.mag.assign(n, 0.0);
  ref.relu_mag.assign(n, 0.0);
  const std::vector<double> qd = DecodeQRow(layout, q, r);
  const float* w = q.weights.data() + static_cast<int64_t>(r) * heads;
  std::vector<uint8_t> entry(layout.entry_bytes());
  std::vector<double> k;
  double kscale = 1;
  for (int32_t e = 0; e < n; ++e) {
    const int32_t page = rows.Page(s, e / layout.page_entries);
    EXPECT_TRUE(cpu.ReadEntries(layout, cpu_pool, page, e % layout.page_entries, 1, entry.data()).ok());
    DecodeEntry(layout, entry.data(), &k, &kscale);
    ref.logit[e] = EntryLogit(qd, w, heads, k, kscale, &ref.mag[e], &ref.relu_mag[e]);
  }
  return ref;
}

// The SPEC §5 selection rule up to per-entry tolerances, as a set check:
// a kernel whose scores g satisfy |g - logit| <= tol and that keeps the k
// best g (ties broken any way) has, for every left-out e and kept j,
//   logit[e] - tol[e] <= g[e] <= g[j] <= logit[j] + tol[j].
// So: max over left-out (logit - tol) <= min over kept (logit + tol). This
// holds every kept entry to at least the k-th best reference score minus
// the tolerances, and forces every entry clearly above the cut in. Only
// entries of `in` count (null: all n); `kept[e]` marks the kernel's choice.
// Returns "" or what is wrong; *used (if set) is the smallest fraction of
// the tolerances the row needs (0 without an inversion, > 1 on a violation).
inline std::string SetViolation(const std::vector<char>& kept, const std::vector<char>* in,
                         const std::vector<double>& logit, const std::vector<double>& tol,
                         double* used) {
  const int32_t n = static_cast<int32_t>(kept.size());
  auto worst = [&](double s, int32_t* out_e, int32_t* in_j) {
    double lo_kept = INFINITY, hi_out = -INFINITY;
    for (int32_t e = 0; e < n; ++e) {
      if (in != nullptr && !(*in)[e]) continue;
      if (kept[e] && logit[e] + s * tol[e] < lo_kept) lo_kept = logit[e] + s * tol[e], *in_j = e;
      if (!kept[e] && logit[e] - s * tol[e] > hi_out) hi_out = logit[e] - s * tol[e], *out_e = e;
    }
    return hi_out <= lo_kept;
  };
  int32_t e = -1, j = -1;
  if (used != nullptr) {
    *used = 0;
    if (!worst(0, &e, &j)) {
      double lo = 0, hi = 1;
      if (!worst(1, &e, &j)) {
        *used = 2;
      } else {
        for (int i = 0; i < 30; ++i) {
          const double mid = (lo + hi) / 2;
          (worst(mid, &e, &j) ? hi : lo) = mid;
        }
        *used = hi;
      }
    }
  }
  if (worst(1, &e, &j)) return "";
  char buf[320];
  std::snprintf(buf, sizeof(buf),
                "entry %d (score %.9g, tol %.3g) is left out while entry %d (score %.9g, tol %.3g) "
                "is kept: %.3g apart, beyond both tolerances",
                e, logit[e], tol[e], j, logit[j], tol[j], logit[e] - logit[j]);
  return buf;
}

// SPEC §5 for one dense row: count min(n, k), distinct indices in range,
// -1 fill, then the set check. Returns "" or what is wrong.
inline std::string TopkRowViolation(const int32_t* got, int32_t n, int32_t k,
                             const std::vector<double>& logit, const std::vector<double>& tol,
                             double* used) {
  const int32_t valid = std::min(n, k);
  std::vector<char> kept(n, 0);
  for (int32_t i = 0; i < k; ++i) {
    if (i >= valid) {
      if (got[i] != -1) return "slot " + std::to_string(i) + " holds " + std::to_string(got[i]) + ", not -1";
      continue;
    }
    if (got[i] < 0 || got[i] >= n) return "slot " + std::to_string(i) + " holds " + std::to_string(got[i]);
    if (kept[got[i]]) return "duplicate " + std::to_string(got[i]);
    kept[got[i]] = 1;
  }
  if (used != nullptr) *used = 0;
  if (n <= k) return "";
  return SetViolation(kept, nullptr, logit, tol, used);
}

// A candidate consumer's row against the reference (SPEC §5). The pool is
// the source's topk_blocks blocks by their maxima of the source's scores
// (the newest pinned when `spec.pin_newest`), known from the source's
// reference (src_logit, src_tol) up to blocks whose maxima sit within the
// tolerance of the cut: blocks surely in (D), surely out, and borderline
// (B). The pool surely holds P = D and every B block the consumer kept an
// entry of, so: every kept entry lies in D or B; P has no more blocks than
// the pool; the count is min(topk, pool entries), and if it is under topk
// the pool is exactly P, all of it kept; and over P the set check of
// SetViolation holds on the consumer's reference (logit, tol). Without
// borderline blocks P is the pool and this is the exact rule. Returns "" or
// what is wrong; *borderline: the row had B blocks; *used as SetViolation's.
inline std::string ConsumerRowViolation(const int32_t* row, int32_t n, int32_t topk,
                                        const CandidateSpec& spec,
                                        const std::vector<double>& src_logit,
                                        const std::vector<double>& src_tol,
                                        const std::vector<double>& logit,
                                        const std::vector<double>& tol, bool* borderline,
                                        double* used) {
  *borderline = false;
  *used = 0;
  // in[b]: 2 surely in the pool, 1 borderline, 0 surely out.
  const int32_t bs = spec.block_size, nb = (n + bs - 1) / bs;
  std::vector<int> in(nb, 2);
  if (nb > spec.topk_blocks) {
    // Bounds of each block's maximum.
    std::vector<double> lo(nb, -INFINITY), hi(nb, -INFINITY);
    for (int32_t e = 0; e < n; ++e) {
      hi[e / bs] = std::max(hi[e / bs], src_logit[e] + src_tol[e]);
      lo[e / bs] = std::max(lo[e / bs], src_logit[e] - src_tol[e]);
    }
    const bool pin = spec.pin_newest;
    const int32_t slots = pin ? spec.topk_blocks - 1 : spec.topk_blocks;
    std::vector<double> his, los;
    for (int32_t b = 0; b < nb; ++b) {
      if (pin && b == nb - 1) continue;
      his.push_back(hi[b]);
      los.push_back(lo[b]);
    }
    std::sort(his.rbegin(), his.rend());
    std::sort(los.rbegin(), los.rend());
    for (int32_t b = 0; b < nb; ++b) {
      if (pin && b == nb - 1) continue;
      const bool surely_in = slots < static_cast<int32_t>(his.size()) && lo[b] > his[slots];
      const bool surely_out = slots == 0 || hi[b] < los[slots - 1];
      in[b] = surely_in ? 2 : surely_out ? 0 : 1;
    }
  }
  // The row's form, then P = D and the B blocks it used.
  std::vector<char> kept(n, 0);
  int32_t count = 0;
  for (int32_t i = 0; i < topk; ++i) {
    const std::string slot = "slot " + std::to_string(i) + " holds " + std::to_string(row[i]);
    if (row[i] < 0) {
      if (row[i] != -1) return slot + ", not -1";
      continue;
    }
    if (count != i) return slot + " after a -1";
    ++count;
    if (row[i] >= n) return slot + ", not below n";
    if (in[row[i] / bs] == 0) return slot + ", outside the pool";
    if (kept[row[i]]) return slot + ", a duplicate";
    kept[row[i]] = 1;
  }
  std::vector<char> block_in_p(nb, 0), entry_in_p(n, 0);
  for (int32_t b = 0; b < nb; ++b) block_in_p[b] = in[b] == 2;
  for (int32_t e = 0; e < n; ++e) {
    if (kept[e]) block_in_p[e / bs] = 1;
  }
  int64_t p_blocks = 0, p_entries = 0, db_entries = 0;
  for (int32_t b = 0; b < nb; ++b) p_blocks += block_in_p[b];
  for (int32_t e = 0; e < n; ++e) {
    entry_in_p[e] = block_in_p[e / bs];
    p_entries += entry_in_p[e];
    db_entries += in[e / bs] >= 1;
  }
  *borderline = p_entries != db_entries;
  const std::string counts = "count " + std::to_string(count) + ", P holds " + std::to_string(p_blocks) +
                             " blocks and " + std::to_string(p_entries) + " entries, D and B " +
                             std::to_string(db_entries) + " entries";
  if (p_blocks > std::min<int64_t>(nb, spec.topk_blocks)) return "entries from more blocks than the pool holds: " + counts;
  // Count: min(topk, pool entries); the pool holds P and at most the rest of B.
  if (count < std::min<int64_t>(topk, p_entries) || count > std::min<int64_t>(topk, db_entries)) {
    return "wrong count: " + counts;
  }
  if (count < topk && count != p_entries) return "fewer than topk kept, yet not the whole pool: " + counts;
  return SetViolation(kept, &entry_in_p, logit, tol, used);
}

// Largest fraction of the tolerance any checked row needed (printed per test,
// so that a run on the device shows each path's margin).
struct Margin {
  double worst = 0;
  std::string what;
  void Add(double used, const std::string& w) {
    if (used > worst) worst = used, what = w;
  }
  void Print(const std::string& path) const {
    std::printf("[  margin  ] %s: the closest row used %.3g of its tolerance (%s)\n", path.c_str(),
                worst, what.empty() ? "no inversion" : what.c_str());
  }
};

inline void ExpectTopkRow(const int32_t* got, int32_t n, int32_t k,
                   const std::vector<double>& logit,
                   const std::vector<double>& tol, const std::string& what,
                   Margin* margin = nullptr) {
  double used = 0;
  const std::string v = TopkRowViolation(got, n, k, logit, tol, &used);
  ASSERT_EQ(v, "") << what;
  if (margin != nullptr) margin->Add(used, what);
}

}  // namespace gpu_test
}  // namespace indexer

#endif  // INDEXER_TESTS_GPU_GPU_TEST_REFERENCE_H_

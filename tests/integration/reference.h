// A plain, obviously-correct reference of the dense token path for the
// integration tests (SPEC §3, §5): decode every stored entry, accumulate in
// double, and check a top-k row by the SPEC §5 rule. Written independently
// of the backends and of the client's reference on purpose.
#pragma once

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <string>
#include <vector>

#include "gtest/gtest.h"
#include "kernels/format/fp8.h"
#include "kernels/format/mxfp4.h"
#include "kernels/format/page_layout.h"

namespace indexer::testing {

// Entry scale of a linear FP8 entry.
inline double Fp8EntryScale(const PageLayout& L, const uint8_t* entry) {
  float s;
  memcpy(&s, entry + L.value_bytes(), 4);
  return s;
}

// q: one head in the layer's Q form (FP8 codes, or packed e2m1 + scales).
inline double HeadDot(const PageLayout& L, const uint8_t* q, const uint8_t* q_scales,
                      const uint8_t* entry) {
  const int D = L.head_dim;
  if (L.format == KvFormat::kFp8) {
    double acc = 0;
    for (int d = 0; d < D; ++d) acc += double(DecodeE4m3(q[d])) * DecodeE4m3(entry[d]);
    return acc;
  }
  double acc = 0;
  for (int b = 0; b < D / 32; ++b) {
    double block = 0;
    for (int i = b * 32; i < b * 32 + 32; ++i) {
      const double qi = DecodeE2m1(q[i / 2] >> (4 * (i % 2)));
      const double ki = DecodeE2m1(entry[i / 2] >> (4 * (i % 2)));
      block += qi * ki;
    }
    const int e = int(q_scales[b]) - 127 + int(entry[L.value_bytes() + b]) - 127;
    acc += std::ldexp(block, e);
  }
  return acc;
}

// Logit of one row against one linear entry.
inline double RefLogit(const PageLayout& L, int H, const uint8_t* q_row,
                       const uint8_t* qs_row, const float* w_row, const uint8_t* entry) {
  const int vb = L.value_bytes(), sb = L.head_dim / 32;
  double sum = 0;
  for (int h = 0; h < H; ++h) {
    const double dot = HeadDot(L, q_row + h * vb, qs_row ? qs_row + h * sb : nullptr, entry);
    sum += double(w_row[h]) * std::max(dot, 0.0);
  }
  return L.format == KvFormat::kFp8 ? sum * Fp8EntryScale(L, entry) : sum;
}

// Checks one output row against reference logits of its n visible entries:
// min(k, n) distinct indices in [0, n), then -1; each index scores at least
// the k-th best reference score minus a tolerance for fp32 summation order.
inline void ExpectTopkRow(const std::vector<double>& logits, const int32_t* got, int k,
                          const std::string& where) {
  const int n = static_cast<int>(logits.size());
  const int want = std::min(k, n);
  double kth = -INFINITY, max_abs = 0;
  if (want > 0) {
    std::vector<double> sorted = logits;
    std::nth_element(sorted.begin(), sorted.begin() + (want - 1), sorted.end(),
                     std::greater<double>());
    kth = sorted[want - 1];
  }
  for (double v : logits) max_abs = std::max(max_abs, std::abs(v));
  const double tol = 1e-5 * max_abs + 1e-30;
  std::vector<bool> seen(n, false);
  for (int j = 0; j < k; ++j) {
    const int32_t idx = got[j];
    if (j >= want) {
      ASSERT_EQ(idx, -1) << where << " slot " << j << ": expected -1 past " << want
                         << " entries";
      continue;
    }
    ASSERT_GE(idx, 0) << where << " slot " << j;
    ASSERT_LT(idx, n) << where << " slot " << j;
    ASSERT_FALSE(seen[idx]) << where << " index " << idx << " twice";
    seen[idx] = true;
    ASSERT_GE(logits[idx], kth - tol)
        << where << " index " << idx << " scores " << logits[idx]
        << " below the reference top-" << want << " cut " << kth;
  }
}

}  // namespace indexer::testing

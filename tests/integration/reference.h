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

// Element values of one vector in the layer's format, in double: FP8 codes
// decoded in the layout's variant; MXFP4 e2m1 elements times their block's 2^(e8m0 - 127) (exact).
// `scales`: the D/32 e8m0 bytes (MXFP4 only).
inline std::vector<double> DecodeVector(const PageLayout& L, const uint8_t* values,
                                        const uint8_t* scales) {
  const int D = L.head_dim;
  std::vector<double> out(D);
  for (int d = 0; d < D; ++d) {
    if (L.format == KvFormat::kFp8) {
      out[d] = DecodeFp8(L.fp8, values[d]);
    } else {
      out[d] = std::ldexp(double(DecodeE2m1(values[d / 2] >> (4 * (d % 2)))),
                          int(scales[d / 32]) - 127);
    }
  }
  return out;
}

// A linear entry decoded: its elements and its scale (1 for MXFP4).
struct RefEntry {
  std::vector<double> k;
  double scale = 1;
};

inline RefEntry DecodeEntry(const PageLayout& L, const uint8_t* entry) {
  RefEntry e;
  e.k = DecodeVector(L, entry, entry + L.value_bytes());
  if (L.format == KvFormat::kFp8) {
    float s;
    memcpy(&s, entry + L.value_bytes(), 4);
    e.scale = s;
  }
  return e;
}

// SPEC §5: scale * sum_h w[h] * ReLU(q[h] . k), with q [H][D] decoded.
inline double RefLogit(const std::vector<std::vector<double>>& q, const float* w,
                       const RefEntry& e) {
  double sum = 0;
  for (size_t h = 0; h < q.size(); ++h) {
    double dot = 0;
    for (size_t d = 0; d < e.k.size(); ++d) dot += q[h][d] * e.k[d];
    sum += double(w[h]) * std::max(dot, 0.0);
  }
  return sum * e.scale;
}

// Checks one output row against reference logits of its visible entries
// (-inf marks an entry the row may not choose, e.g. outside its candidate
// pool): min(k, chooseable) distinct chooseable indices, then -1; each index
// scores at least the k-th best reference score minus a tolerance for fp32
// summation order.
inline void ExpectTopkRow(const std::vector<double>& logits, const int32_t* got, int k,
                          const std::string& where) {
  const int n = static_cast<int>(logits.size());
  std::vector<double> finite;
  double max_abs = 0;
  for (double v : logits) {
    if (std::isinf(v) && v < 0) continue;
    finite.push_back(v);
    if (std::abs(v) < 1e28) max_abs = std::max(max_abs, std::abs(v));  // not a sentinel
  }
  const int want = std::min<int>(k, static_cast<int>(finite.size()));
  double kth = -INFINITY;
  if (want > 0) {
    std::nth_element(finite.begin(), finite.begin() + (want - 1), finite.end(),
                     std::greater<double>());
    kth = finite[want - 1];
  }
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
    ASSERT_FALSE(std::isinf(logits[idx]) && logits[idx] < 0)
        << where << " index " << idx << " is not chooseable (outside the pool)";
    ASSERT_GE(logits[idx], kth - tol)
        << where << " index " << idx << " scores " << logits[idx]
        << " below the reference top-" << want << " cut " << kth;
  }
}

}  // namespace indexer::testing

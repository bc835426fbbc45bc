// TopkRow (SPEC §5): the tie rule, short rows and k > n.
#include <algorithm>
#include <cstdint>
#include <random>
#include <vector>

#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "kernels/cpu/topk.h"

namespace indexer {
namespace {

using ::testing::ElementsAre;
using ::testing::ElementsAreArray;

std::vector<int32_t> Topk(const std::vector<float>& x, int32_t k) {
  std::vector<int32_t> out(k, -7);
  TopkRow(x.data(), static_cast<int32_t>(x.size()), k, out.data());
  return out;
}

// The reference: sort positions by (logit desc, position asc).
std::vector<int32_t> Reference(const std::vector<float>& x, int32_t k) {
  std::vector<int32_t> idx(x.size());
  for (size_t i = 0; i < idx.size(); ++i) idx[i] = static_cast<int32_t>(i);
  std::stable_sort(idx.begin(), idx.end(),
                   [&](int32_t a, int32_t b) { return x[a] > x[b]; });
  idx.resize(std::min<size_t>(idx.size(), k));
  return idx;
}

TEST(TopkTest, TiesGoToTheSmallerPosition) {
  const std::vector<float> x = {1, 5, 3, 5, 5, 2, 5};
  EXPECT_THAT(Topk(x, 2), ElementsAre(1, 3));
  EXPECT_THAT(Topk(x, 3), ElementsAre(1, 3, 4));
  EXPECT_THAT(Topk(x, 5), ElementsAre(1, 3, 4, 6, 2));
}

TEST(TopkTest, SignedZerosTie) {
  const std::vector<float> x = {-1, -0.0f, 0.0f, -0.0f, -2};
  EXPECT_THAT(Topk(x, 2), ElementsAre(1, 2));
}

TEST(TopkTest, ShortRowsFillWithMinusOne) {
  const std::vector<float> x = {0.5f, -3, 2};
  EXPECT_THAT(Topk(x, 3), ElementsAre(0, 1, 2));
  EXPECT_THAT(Topk(x, 5), ElementsAre(0, 1, 2, -1, -1));
  EXPECT_THAT(Topk({}, 4), ElementsAre(-1, -1, -1, -1));
}

TEST(TopkTest, ZeroKWritesNothing) {
  const std::vector<float> x = {1, 2};
  int32_t out = -7;
  TopkRow(x.data(), 2, 0, &out);
  EXPECT_EQ(out, -7);
}

TEST(TopkTest, NegativeAndInfiniteValues) {
  const std::vector<float> x = {-INFINITY, -5, INFINITY, -1e30f, -5};
  EXPECT_THAT(Topk(x, 3), ElementsAre(2, 1, 4));
}

class TopkRandomTest
    : public testing::TestWithParam<std::tuple<int32_t, int32_t>> {};

TEST_P(TopkRandomTest, MatchesStableSortReference) {
  const auto [n, k] = GetParam();
  std::mt19937 rng(n * 7919 + k);
  // Few distinct values, so ties at the cut are common.
  std::uniform_int_distribution<int> small(-20, 20);
  std::vector<float> x(n);
  for (float& v : x) v = small(rng) * 0.25f;
  std::vector<int32_t> want;
  if (n <= k) {
    // SPEC §5: a short row holds 0 .. n-1, then -1.
    for (int32_t i = 0; i < n; ++i) want.push_back(i);
  } else {
    want = Reference(x, k);
  }
  want.resize(k, -1);
  EXPECT_THAT(Topk(x, k), ElementsAreArray(want));
}

INSTANTIATE_TEST_SUITE_P(Sizes, TopkRandomTest,
                         testing::Combine(testing::Values(1, 3, 17, 1000,
                                                          40000),
                                          testing::Values(1, 5, 64, 2048)));

}  // namespace
}  // namespace indexer

// The benches' median of samples, GPU-free (bench_util.h and the --trace
// summary, trace_stats.h, whose unit test builds without a GPU).
#pragma once

#include <algorithm>
#include <vector>

namespace indexer {
namespace bench {

// The upper median (samples of an even count take the larger middle one).
inline double Median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  return v.empty() ? 0 : v[v.size() / 2];
}

}  // namespace bench
}  // namespace indexer

// Helpers shared by the gpu benches (gpu_bench.cu, hopper/peaks.cu): a
// runtime-call check that ends the bench, and the median of samples.
#pragma once

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <vector>

#include "kernels/gpu/gpu_compat.h"
#include "tests/bench/median.h"

#define CHECK_GPU(expr)                                                     \
  do {                                                                      \
    const ::indexer::gpu::Error _e = (expr);                                \
    if (_e != ::indexer::gpu::kSuccess) {                                   \
      std::fprintf(stderr, "%s failed: %s (%s:%d)\n", #expr,                \
                   ::indexer::gpu::ErrorString(_e), __FILE__, __LINE__);    \
      std::exit(1);                                                         \
    }                                                                       \
  } while (0)

namespace indexer {
namespace bench {

}  // namespace bench
}  // namespace indexer

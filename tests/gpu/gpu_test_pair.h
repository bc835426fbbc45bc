// The gpu backend tests' fixture pieces: a cpu and a gpu backend with one
// pool each (same page numbering), their pools compared byte for byte, and
// scenarios of sequences whose K both backends hold. Shared by
// gpu_backend_test.cc and gpu_paths_test.cc (one test binary).
#ifndef INDEXER_TESTS_GPU_GPU_TEST_PAIR_H_
#define INDEXER_TESTS_GPU_GPU_TEST_PAIR_H_

#include <algorithm>
#include <cstdint>
#include <memory>
#include <random>
#include <string>
#include <vector>

#include "gtest/gtest.h"
#include "kernels/backend.h"
#include "kernels/cpu/cpu_backend.h"
#include "kernels/gpu/gpu_backend.h"
#include "kernels/gpu/gpu_compat.h"
#include "kernels/gpu/params.h"
#include "tests/gpu/gpu_test_reference.h"

#define SKIP_WITHOUT_GPU()                                               \
  if (GpuDeviceCount() == 0) {                                           \
    GTEST_SKIP() << "no GPU: GpuDeviceCount() == 0 on this machine";     \
  }

namespace indexer {
namespace gpu_test {

// Device buffers for a test that drives kernels directly, freed when it
// goes out of scope; Get fails the test (and returns null) when an
// allocation does.
class DeviceBuffers {
 public:
  DeviceBuffers() = default;
  DeviceBuffers(const DeviceBuffers&) = delete;
  DeviceBuffers& operator=(const DeviceBuffers&) = delete;
  ~DeviceBuffers() {
    for (void* p : bufs_) gpu::Free(p);
  }
  template <class T = void>
  T* Get(size_t bytes) {
    void* p = nullptr;
    EXPECT_EQ(gpu::Malloc(&p, std::max<size_t>(bytes, 4)), gpu::kSuccess);
    bufs_.push_back(p);
    return static_cast<T*>(p);
  }

 private:
  std::vector<void*> bufs_;
};

// Two backends with one pool each, same page numbering.
struct Pair {
  std::unique_ptr<CpuBackend> cpu;
  std::unique_ptr<Backend> gpu;
  PoolHandle cpu_pool;
  PoolHandle gpu_pool;
  int64_t pages = 0;
};

inline Pair MakePair(const PageLayout& layout, int64_t pages) {
  Pair p;
  p.cpu = std::make_unique<CpuBackend>(0);
  auto g = MakeGpuBackend(0, 0);
  EXPECT_TRUE(g.ok()) << g.status();
  p.gpu = std::move(*g);
  p.pages = pages;
  p.cpu_pool = *p.cpu->AllocatePool(layout, pages);
  auto gp = p.gpu->AllocatePool(layout, pages);
  EXPECT_TRUE(gp.ok()) << gp.status();
  p.gpu_pool = *gp;
  return p;
}

// Raw pool bytes of the gpu pool.
inline std::vector<uint8_t> GpuPoolBytes(const Pair& p, const PageLayout& layout) {
  std::vector<uint8_t> host(static_cast<size_t>(p.pages * layout.page_bytes()));
  EXPECT_EQ(gpu::CopyD2H(host.data(), p.gpu_pool.base, host.size(), nullptr), gpu::kSuccess);
  EXPECT_EQ(gpu::StreamSynchronize(nullptr), gpu::kSuccess);
  return host;
}

inline void ExpectPoolsEqual(const Pair& p, const PageLayout& layout) {
  const std::vector<uint8_t> g = GpuPoolBytes(p, layout);
  int64_t diffs = 0, first = -1;
  for (size_t i = 0; i < g.size(); ++i) {
    if (g[i] != p.cpu_pool.base[i]) {
      if (first < 0) first = static_cast<int64_t>(i);
      ++diffs;
    }
  }
  EXPECT_EQ(diffs, 0) << "pool bytes differ, first at byte " << first
                      << " (page " << first / std::max<int64_t>(1, layout.page_bytes())
                      << "): gpu " << (first >= 0 ? int(g[first]) : 0)
                      << " cpu " << (first >= 0 ? int(p.cpu_pool.base[first]) : 0);
}

inline RefRow RefLogits(const Pair& p, const PageLayout& layout, const StepRows& rows, const QData& q,
                 int32_t r) {
  return RefLogits(*p.cpu, p.cpu_pool, layout, rows, q, r);
}

// Sequences with `hist` old entries each and `q_len` new rows, pages
// shuffled, K written to both backends (history, then the step's entries).
struct Scenario {
  Pair p;
  StepRows rows;
  std::unique_ptr<StepContext> cpu_ctx, gpu_ctx;
};

inline Scenario MakeScenario(std::mt19937& rng, const PageLayout& layout,
                      const std::vector<int32_t>& hist,
                      const std::vector<int32_t>& q_lens) {
  Scenario sc;
  const int32_t seqs = static_cast<int32_t>(hist.size()), pe = layout.page_entries;
  std::vector<int32_t> new_e, zeros(seqs, 0);
  std::vector<std::vector<int32_t>> pages(seqs);
  int64_t total = 0;
  for (int32_t s = 0; s < seqs; ++s) {
    new_e.push_back(hist[s] + q_lens[s]);
    total += PagesFor(new_e[s], pe);
  }
  std::vector<int32_t> perm(total + 3);
  for (size_t i = 0; i < perm.size(); ++i) perm[i] = static_cast<int32_t>(i);
  std::shuffle(perm.begin(), perm.end(), rng);
  int64_t next = 0;
  for (int32_t s = 0; s < seqs; ++s) {
    for (int32_t i = 0; i < PagesFor(new_e[s], pe); ++i) pages[s].push_back(perm[next++]);
  }
  sc.p = MakePair(layout, static_cast<int64_t>(perm.size()));
  const StepRows h = MakeStep(zeros, hist, zeros, pe, pages, 0);
  KData hk = MakeK(rng, layout, h.NewEntries(), KInput::Kind::kFloat32, true);
  EXPECT_TRUE(sc.p.cpu->WriteEntries(layout, sc.p.cpu_pool, h, nullptr, hk.input).ok());
  EXPECT_TRUE(sc.p.gpu->WriteEntries(layout, sc.p.gpu_pool, h, nullptr, hk.input).ok());
  sc.rows = MakeStep(hist, new_e, q_lens, pe, pages, 0);
  KData nk = MakeK(rng, layout, sc.rows.NewEntries(), KInput::Kind::kFloat32, true);
  sc.cpu_ctx = *sc.p.cpu->PrepareStep(layout, sc.rows);
  auto g = sc.p.gpu->PrepareStep(layout, sc.rows);
  EXPECT_TRUE(g.ok()) << g.status();
  sc.gpu_ctx = std::move(*g);
  EXPECT_TRUE(sc.p.cpu->WriteEntries(layout, sc.p.cpu_pool, sc.rows, sc.cpu_ctx.get(), nk.input).ok());
  EXPECT_TRUE(sc.p.gpu->WriteEntries(layout, sc.p.gpu_pool, sc.rows, sc.gpu_ctx.get(), nk.input).ok());
  return sc;
}

inline std::string PathSuffix(int max_path) {
  return max_path == 0                      ? "_portable"
         : max_path == 1                    ? "_mma"
         : max_path == gpu::kPathMfmaGfx942 ? "_mfma942"
         : max_path == gpu::kPathMfmaGfx950 ? "_mfma950"
                                            : "";
}

// A run at max_path kPathMfmaGfx942 / kPathMfmaGfx950 must have taken the
// MFMA kernel wherever it takes the call (FP8 on both, MXFP4 on gfx950): the
// instruction model on CUDA, the matrix cores on HIP.
// (gfx950 multiplies OCP e4m3: an e4m3fnuz cache takes the portable kernel.)
inline void ExpectMfmaPath(int max_path, KvFormat format, const std::string& path,
                           bool fnuz = false) {
  if (max_path == gpu::kPathMfmaGfx942 || max_path == gpu::kPathMfmaGfx950) {
    const bool takes = format == KvFormat::kFp8 ? max_path == gpu::kPathMfmaGfx942 || !fnuz
                                                : max_path == gpu::kPathMfmaGfx950;
    const std::string arch = max_path == gpu::kPathMfmaGfx942 ? "gfx942" : "gfx950";
    if (takes) {
      EXPECT_TRUE(path == "mfma_model_" + arch || path == "mfma_" + arch) << path;
    } else {
      EXPECT_EQ(path, "portable");
    }
  }
}

}  // namespace gpu_test
}  // namespace indexer

#endif  // INDEXER_TESTS_GPU_GPU_TEST_PAIR_H_

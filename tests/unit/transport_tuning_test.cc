// TuneAllocator's malloc settings (proto/transport_tuning.h): the arena cap
// holds however many threads allocate. One test per process: ctest runs each
// test of a binary in a process of its own, and this binary has no other, so
// no thread has made an arena before it.
#include "proto/transport_tuning.h"

#include <malloc.h>

#include <atomic>
#include <cstdio>
#include <cstdlib>
#include <string>
#include <thread>
#include <vector>

#include "gtest/gtest.h"
#include "tests/sanitized_build.h"

namespace indexer::transport {
namespace {

// The arenas glibc has made: malloc_info writes one <heap nr="..."> per arena.
int Arenas() {
  char* buf = nullptr;
  size_t len = 0;
  FILE* f = open_memstream(&buf, &len);
  if (f == nullptr) return -1;
  malloc_info(0, f);
  std::fclose(f);
  const std::string xml(buf, len);
  std::free(buf);
  int n = 0;
  for (size_t at = xml.find("<heap nr="); at != std::string::npos; at = xml.find("<heap nr=", at + 1)) ++n;
  return n;
}

TEST(TransportTuningTest, ArenasStayCappedWhileManyThreadsAllocate) {
  if (testing::kSanitized) GTEST_SKIP() << "a sanitizer's allocator replaces glibc malloc";
  if (std::getenv("MALLOC_ARENA_MAX") != nullptr) GTEST_SKIP() << "MALLOC_ARENA_MAX is set: it wins";
  ASSERT_TRUE(TuneAllocator());
  // Sixteen threads, each holding a message-sized block until all have
  // allocated: glibc gives a thread's first allocation a new arena while
  // it is under its cap (8 per core unless capped).
  constexpr int kThreads = 16;
  std::atomic<int> allocated{0};
  std::atomic<bool> release{false};
  std::vector<std::thread> threads;
  for (int i = 0; i < kThreads; ++i) {
    threads.emplace_back([&] {
      void* p = std::malloc(600 << 10);
      static_cast<volatile char*>(p)[0] = 1;
      ++allocated;
      while (!release.load()) std::this_thread::yield();
      std::free(p);
    });
  }
  while (allocated.load() < kThreads) std::this_thread::yield();
  const int arenas = Arenas();
  release = true;
  for (std::thread& t : threads) t.join();
  // At least the main arena and one thread's: the count sees them.
  EXPECT_GE(arenas, 2);
  EXPECT_LE(arenas, kMaxArenas);
}

}  // namespace
}  // namespace indexer::transport

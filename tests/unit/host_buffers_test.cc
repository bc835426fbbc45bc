// HostBufferPool: bounds, reuse by size class, refusal when full (the
// caller's copying path), and bytes never lost or shared between leases.
#include "kernels/host_buffers.h"

#include <cstring>
#include <vector>

#include "gtest/gtest.h"

namespace indexer {
namespace {

TEST(HostBuffersTest, SizeClassesArePowersOfTwoFrom4KiB) {
  EXPECT_EQ(HostBufferPool::SizeClass(1), 4096);
  EXPECT_EQ(HostBufferPool::SizeClass(4096), 4096);
  EXPECT_EQ(HostBufferPool::SizeClass(4097), 8192);
  EXPECT_EQ(HostBufferPool::SizeClass(98304), 131072);
}

TEST(HostBuffersTest, ReusesAReturnedBufferOfTheSameClass) {
  auto pool = HostBufferPool::Heap();
  uint8_t* first = nullptr;
  {
    HostLease a = pool->Lend(5000);
    ASSERT_TRUE(a);
    EXPECT_EQ(a.size(), 5000);
    EXPECT_EQ(a.capacity(), 8192);
    first = a.data();
    EXPECT_TRUE(pool->Contains(a.data(), 8192));
    EXPECT_TRUE(pool->Contains(a.data() + 100, 100));
    EXPECT_FALSE(pool->Contains(a.data() + 100, 8192));
  }
  EXPECT_FALSE(pool->Contains(first, 1)) << "an idle buffer is not lent";
  HostLease b = pool->Lend(6000);
  EXPECT_EQ(b.data(), first);
  HostBufferPool::Stats s = pool->stats();
  EXPECT_EQ(s.buffers, 1);
  EXPECT_EQ(s.lent, 1);
  EXPECT_EQ(s.lends, 2);
  EXPECT_EQ(s.reuses, 1);
}

TEST(HostBuffersTest, NeverMoreThanSixteenBuffers) {
  auto pool = HostBufferPool::Heap();
  std::vector<HostLease> held;
  for (int i = 0; i < 16; ++i) {
    held.push_back(pool->Lend(100));
    ASSERT_TRUE(held.back()) << i;
  }
  HostLease refused = pool->Lend(100);
  EXPECT_FALSE(refused) << "the 17th buffer";
  EXPECT_EQ(pool->stats().refusals, 1);
  EXPECT_EQ(pool->stats().buffers, 16);
  held.pop_back();
  EXPECT_TRUE(pool->Lend(100));
}

TEST(HostBuffersTest, NeverMoreThanTheByteBound) {
  auto pool = HostBufferPool::Heap();  // 256 MiB
  HostLease big = pool->Lend(int64_t{200} << 20);  // class 256 MiB
  ASSERT_TRUE(big);
  EXPECT_FALSE(pool->Lend(4096)) << "256 MiB already taken";
  EXPECT_FALSE(pool->Lend((int64_t{256} << 20) + 1)) << "over the bound by itself";
  big.Reset();
  // The idle 256 MiB buffer is freed to make room for another class.
  HostLease small = pool->Lend(4096);
  ASSERT_TRUE(small);
  HostBufferPool::Stats s = pool->stats();
  EXPECT_EQ(s.buffers, 1);
  EXPECT_EQ(s.bytes, 4096);
}

TEST(HostBuffersTest, IdleBuffersOfOtherClassesMakeRoom) {
  HostBufferPool::Limits lim;
  lim.max_buffers = 2;
  lim.max_bytes = 1 << 20;
  auto pool = HostBufferPool::Heap(lim);
  { HostLease a = pool->Lend(4096), b = pool->Lend(8192); }
  HostLease c = pool->Lend(16384);  // evicts an idle one
  HostLease d = pool->Lend(4096);   // reuse or room again
  EXPECT_TRUE(c);
  EXPECT_TRUE(d);
  EXPECT_LE(pool->stats().buffers, 2);
  EXPECT_FALSE(pool->Lend(4096)) << "both lent";
}

TEST(HostBuffersTest, LeasesKeepTheirBytes) {
  auto pool = HostBufferPool::Heap();
  std::vector<HostLease> held;
  for (int i = 0; i < 16; ++i) {
    held.push_back(pool->Lend(4096 + i));
    std::memset(held.back().data(), i, static_cast<size_t>(held.back().size()));
  }
  // Returning and re-lending some must not touch the others.
  for (int i = 0; i < 16; i += 2) held[i].Reset();
  for (int i = 0; i < 16; i += 2) {
    held[i] = pool->Lend(4096);
    std::memset(held[i].data(), 0xee, 4096);
  }
  for (int i = 1; i < 16; i += 2) {
    for (int64_t j = 0; j < held[i].size(); ++j) ASSERT_EQ(held[i].data()[j], i) << i << " " << j;
  }
}

TEST(HostBuffersTest, ALeaseOutlivesThePool) {
  HostLease kept;
  {
    auto pool = HostBufferPool::Heap();
    kept = pool->Lend(100);
    ASSERT_TRUE(kept);
    kept.data()[99] = 7;
  }
  EXPECT_EQ(kept.data()[99], 7);
  kept.Reset();  // freed now (ASan checks the rest)
}

TEST(HostBuffersTest, NothingIsLentAfterShutdown) {
  auto pool = HostBufferPool::Heap();
  HostLease a = pool->Lend(100);
  pool->Shutdown();
  EXPECT_FALSE(pool->Lend(100));
  a.Reset();
  EXPECT_EQ(pool->stats().buffers, 0);
}

TEST(HostBuffersTest, AllocationFailureIsARefusal) {
  HostBufferPool pool([](size_t) -> void* { return nullptr; }, [](void*) {}, false,
                      HostBufferPool::Limits());
  EXPECT_FALSE(pool.Lend(100));
  EXPECT_EQ(pool.stats().refusals, 1);
  EXPECT_EQ(pool.stats().buffers, 0);
}

}  // namespace
}  // namespace indexer

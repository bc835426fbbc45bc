// RegionRegistry without a transport: ownership, the checks of a lookup,
// the lease on an injected clock, and the deferred unmap of a pinned region
// (observed in /proc/self/maps); MemfdTokens: its limits, the TTL on an
// injected clock, single use, and the shrink seal it adds.
#include "server/core/regions.h"

#include <fcntl.h>
#include <sys/mman.h>
#include <unistd.h>

#include <cerrno>

#include <fstream>
#include <memory>
#include <string>

#include "client/shm_region.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "kernels/cpu/cpu_backend.h"
#include "server/core/memfd_tokens.h"

namespace indexer {
namespace {

using ::testing::HasSubstr;

std::string UniqueName(const std::string& what) {
  static int counter = 0;
  return "/indexer-test-" + what + "-" + std::to_string(getpid()) + "-" +
         std::to_string(counter++);
}

// Mappings of the shared-memory object `name` in this process.
int MapCount(const std::string& name) {
  std::ifstream maps("/proc/self/maps");
  std::string line;
  int n = 0;
  while (std::getline(maps, line)) {
    if (line.find("/dev/shm" + name) != std::string::npos) ++n;
  }
  return n;
}

// True while the registry maps it (the test's own ShmRegion is the other).
bool Mapped(const std::string& name) { return MapCount(name) > 1; }

class RegistryTest : public ::testing::Test {
 protected:
  RegistryTest() : registry_(&backend_, 100, [this] { return now_; }) {
    auto shm = client::ShmRegion::Create(UniqueName("reg"), 3 * 4096);
    EXPECT_TRUE(shm.ok()) << shm.status();
    shm_ = *std::move(shm);
    EXPECT_EQ(MapCount(shm_.name()), 1);
  }

  void ExpectStatus(const absl::Status& s, absl::StatusCode code, const std::string& text) {
    EXPECT_EQ(s.code(), code) << s;
    EXPECT_THAT(std::string(s.message()), HasSubstr(text));
  }

  CpuBackend backend_{1};
  int64_t now_ = 1000;
  RegionRegistry registry_;
  client::ShmRegion shm_;
};

TEST_F(RegistryTest, HostRegionMapsTheObjectAtItsOffset) {
  shm_.data()[4096 + 32] = 0x5a;
  auto id = registry_.RegisterHost("a", "inputs", shm_.name(), 4096, 2 * 4096);
  ASSERT_TRUE(id.ok()) << id.status();
  auto pin = registry_.Lookup("a", "q.ref", {*id, 32, 64});
  ASSERT_TRUE(pin.ok()) << pin.status();
  EXPECT_EQ(pin->data[0], 0x5a);
  EXPECT_FALSE(pin->on_device);
  EXPECT_EQ(pin->bytes, 64u);
  pin->data[1] = 0x33;  // read-write, shared with the creator
  EXPECT_EQ(shm_.data()[4096 + 33], 0x33);
  // The last 16 bytes are in; one more is not.
  EXPECT_TRUE(registry_.Lookup("a", "q.ref", {*id, 2 * 4096 - 16, 16}).ok());
}

TEST_F(RegistryTest, RegisterErrorsNameTheField) {
  ExpectStatus(registry_.RegisterHost("a", "x", UniqueName("missing"), 0, 16).status(),
               absl::StatusCode::kNotFound, "host.shm_name: no shared-memory object");
  ExpectStatus(registry_.RegisterHost("a", "x", shm_.name(), 0, 3 * 4096 + 1).status(),
               absl::StatusCode::kInvalidArgument, "host.bytes: expected offset + bytes <= ");
  ExpectStatus(registry_.RegisterHost("a", "x", shm_.name(), 4096, 2 * 4096 + 1).status(),
               absl::StatusCode::kInvalidArgument, "host.bytes");
  ExpectStatus(registry_.RegisterHost("a", "x", shm_.name(), 0, 0).status(),
               absl::StatusCode::kInvalidArgument, "host.bytes: expected >= 1, got 0");
  ExpectStatus(registry_.RegisterHost("a", "x", shm_.name(), 100, 16).status(),
               absl::StatusCode::kInvalidArgument, "host.offset: expected a multiple of");
  ExpectStatus(registry_.RegisterHost("a", "", shm_.name(), 0, 16).status(),
               absl::StatusCode::kInvalidArgument, "name: expected 1..128 bytes");
  ExpectStatus(registry_.RegisterHost("a", "x", "", 0, 16).status(),
               absl::StatusCode::kInvalidArgument, "host.shm_name");
  // The cpu backend has no device regions; a device offset off the 16-byte
  // grid is refused before any backend is asked.
  ExpectStatus(registry_.RegisterDevice("a", "d", {std::string(64, '\x7f'), "GPU-0", "", 0, 64})
                   .status(),
               absl::StatusCode::kFailedPrecondition, "need the gpu backend");
  ExpectStatus(registry_.RegisterDevice("a", "d", {std::string(64, '\x7f'), "GPU-0", "", 8, 64})
                   .status(),
               absl::StatusCode::kInvalidArgument, "device.offset: expected a multiple of 16, got 8");
  EXPECT_EQ(registry_.size(), 0u);
}

TEST_F(RegistryTest, LookupChecks) {
  auto id = registry_.RegisterHost("a", "r", shm_.name(), 0, 4096);
  ASSERT_TRUE(id.ok());
  ExpectStatus(registry_.Lookup("a", "k.ref", {*id + 1, 0, 16}).status(),
               absl::StatusCode::kNotFound, "k.ref.region: region " + std::to_string(*id + 1) +
                                                " not found");
  // Another owner's region looks unknown.
  ExpectStatus(registry_.Lookup("b", "k.ref", {*id, 0, 16}).status(),
               absl::StatusCode::kNotFound, "k.ref.region: region " + std::to_string(*id) +
                                                " not found");
  ExpectStatus(registry_.Lookup("a", "k.ref", {*id, 8, 16}).status(),
               absl::StatusCode::kInvalidArgument, "k.ref.offset: expected a multiple of 16");
  ExpectStatus(registry_.Lookup("a", "k.ref", {*id, 4080, 32}).status(),
               absl::StatusCode::kInvalidArgument, "k.ref.bytes: expected offset + bytes <= 4096");
  ExpectStatus(registry_.Lookup("a", "k.ref", {*id, 8192, 0}).status(),
               absl::StatusCode::kInvalidArgument, "k.ref.bytes");
  // Others can neither list nor unregister it.
  EXPECT_TRUE(registry_.List("b").empty());
  ExpectStatus(registry_.Unregister("b", *id), absl::StatusCode::kNotFound, "region");
  ASSERT_EQ(registry_.List("a").size(), 1u);
  EXPECT_TRUE(registry_.Unregister("a", *id).ok());
  ExpectStatus(registry_.Lookup("a", "k.ref", {*id, 0, 16}).status(),
               absl::StatusCode::kNotFound, "not found");
  // Ids are never reused.
  auto again = registry_.RegisterHost("a", "r", shm_.name(), 0, 4096);
  ASSERT_TRUE(again.ok());
  EXPECT_GT(*again, *id);
}

TEST_F(RegistryTest, LeaseRenewedByUseAndList) {
  auto id = registry_.RegisterHost("a", "r", shm_.name(), 0, 4096);
  ASSERT_TRUE(id.ok());
  now_ += 90;
  ASSERT_TRUE(registry_.Lookup("a", "q.ref", {*id, 0, 16}).ok());  // renews
  now_ += 90;
  auto list = registry_.List("a");  // renews
  ASSERT_EQ(list.size(), 1u);
  EXPECT_EQ(list[0].idle_ms, 90u);
  EXPECT_EQ(list[0].kind, "host");
  EXPECT_EQ(list[0].where, shm_.name());
  now_ += 99;
  EXPECT_EQ(registry_.size(), 1u);
  ASSERT_TRUE(registry_.Lookup("a", "q.ref", {*id, 0, 16}).ok());
  now_ += 100;  // a full lease unused
  EXPECT_EQ(registry_.Lookup("a", "q.ref", {*id, 0, 16}).status().code(),
            absl::StatusCode::kNotFound);
  EXPECT_EQ(registry_.size(), 0u);
  EXPECT_FALSE(Mapped(shm_.name()));
}

TEST_F(RegistryTest, AnotherClientsCallExpiresIdleRegions) {
  ASSERT_TRUE(registry_.RegisterHost("a", "r", shm_.name(), 0, 4096).ok());
  now_ += 100;
  EXPECT_TRUE(registry_.List("b").empty());
  EXPECT_EQ(registry_.size(), 0u);
}

TEST_F(RegistryTest, PinnedRegionOutlivesUnregisterAndExpiry) {
  auto id = registry_.RegisterHost("a", "r", shm_.name(), 0, 4096);
  ASSERT_TRUE(id.ok());
  auto pin = registry_.Lookup("a", "q.ref", {*id, 0, 4096});
  ASSERT_TRUE(pin.ok());
  ASSERT_TRUE(registry_.Unregister("a", *id).ok());
  // Unlisted at once, still mapped for the layer that holds it.
  EXPECT_TRUE(registry_.List("a").empty());
  EXPECT_TRUE(Mapped(shm_.name()));
  pin->data[4095] = 7;
  EXPECT_EQ(shm_.data()[4095], 7);
  *pin = PinnedRegion();
  EXPECT_FALSE(Mapped(shm_.name()));

  // The same through the lease.
  auto id2 = registry_.RegisterHost("a", "r", shm_.name(), 0, 4096);
  ASSERT_TRUE(id2.ok());
  auto pin2 = registry_.Lookup("a", "q.ref", {*id2, 16, 16});
  ASSERT_TRUE(pin2.ok());
  now_ += 1000;
  EXPECT_EQ(registry_.size(), 1u);  // nothing called yet
  EXPECT_TRUE(registry_.List("a").empty());
  EXPECT_TRUE(Mapped(shm_.name()));
  pin2->data[0] = 9;
  EXPECT_EQ(shm_.data()[16], 9);
  pin2 = absl::StatusOr<PinnedRegion>(PinnedRegion());
  EXPECT_FALSE(Mapped(shm_.name()));
}

TEST_F(RegistryTest, DefaultLease) {
  RegionRegistry r(nullptr, 0);
  EXPECT_EQ(r.lease_ms(), 300000u);
}

// A sealable memfd of 4096 bytes; the caller owns the descriptor.
int NewMemfd() {
  const int fd = memfd_create("registry-test", MFD_CLOEXEC | MFD_ALLOW_SEALING);
  EXPECT_GE(fd, 0);
  EXPECT_EQ(ftruncate(fd, 4096), 0);
  return fd;
}

absl::StatusOr<uint64_t> Accept(const MemfdClaim&) { return 7; }

TEST(MemfdTokensTest, BoundedPerUidAndInAll) {
  int64_t now = 0;
  MemfdTokens tokens(1000, [&] { return now; });
  for (size_t i = 0; i < MemfdTokens::kMaxTokensPerUid; ++i) {
    ASSERT_TRUE(tokens.Issue(NewMemfd(), 1, 100).ok());
  }
  const int refused = NewMemfd();
  const int mine = dup(refused);
  auto over = tokens.Issue(refused, 1, 100);
  EXPECT_EQ(over.status().code(), absl::StatusCode::kResourceExhausted);
  EXPECT_THAT(std::string(over.status().message()), HasSubstr("(64 for this uid)"));
  EXPECT_FALSE(fcntl(mine, F_GET_SEALS) & F_SEAL_SHRINK);  // a refusal changes nothing
  close(mine);
  for (uint32_t uid = 2; tokens.size() < MemfdTokens::kMaxTokens; ++uid) {
    ASSERT_TRUE(tokens.Issue(NewMemfd(), uid, 100).ok());
  }
  over = tokens.Issue(NewMemfd(), 999, 100);
  EXPECT_EQ(over.status().code(), absl::StatusCode::kResourceExhausted);
  EXPECT_THAT(std::string(over.status().message()), HasSubstr("(256)"));
  // The TTL frees every slot.
  now = 1000;
  tokens.Expire();
  EXPECT_EQ(tokens.size(), 0u);
  EXPECT_TRUE(tokens.Issue(NewMemfd(), 1, 100).ok());
}

TEST(MemfdTokensTest, SingleUseAndAFailedUseKeepsTheToken) {
  int64_t now = 0;
  MemfdTokens tokens(1000, [&] { return now; });
  const int fd = NewMemfd();
  auto token = tokens.Issue(fd, 5, 100);
  ASSERT_TRUE(token.ok()) << token.status();
  EXPECT_EQ(token->size(), 32u);
  auto refused = tokens.Redeem("host.memfd_token", *token, 5, [](const MemfdClaim&) {
    return absl::StatusOr<uint64_t>(absl::InvalidArgumentError("host.bytes: too many"));
  });
  EXPECT_EQ(refused.status().code(), absl::StatusCode::kInvalidArgument);
  auto other = tokens.Redeem("host.memfd_token", *token, 6, Accept);
  EXPECT_EQ(other.status().code(), absl::StatusCode::kPermissionDenied);
  EXPECT_EQ(tokens.size(), 1u);
  EXPECT_EQ(fcntl(fd, F_GETFD), FD_CLOEXEC);  // still held
  // Unknown caller uid (a Unix-socket caller): the token alone decides.
  int seen_pid = 0;
  auto used = tokens.Redeem("host.memfd_token", *token, std::nullopt,
                            [&](const MemfdClaim& c) -> absl::StatusOr<uint64_t> {
                              seen_pid = c.pid;
                              EXPECT_EQ(c.fd, fd);
                              EXPECT_EQ(c.uid, 5u);
                              EXPECT_THAT(c.memfd_name, HasSubstr("memfd:registry-test"));
                              return 7;
                            });
  ASSERT_TRUE(used.ok()) << used.status();
  EXPECT_EQ(*used, 7u);
  EXPECT_EQ(seen_pid, 100);
  EXPECT_EQ(fcntl(fd, F_GETFD), -1);  // closed once redeemed
  EXPECT_EQ(tokens.size(), 0u);
  auto again = tokens.Redeem("host.memfd_token", *token, 5, Accept);
  EXPECT_EQ(again.status().code(), absl::StatusCode::kNotFound);
  EXPECT_THAT(std::string(again.status().message()), HasSubstr("already used"));
  // An expired one says so.
  auto late = tokens.Issue(NewMemfd(), 5, 100);
  ASSERT_TRUE(late.ok());
  now = 1000;
  auto expired = tokens.Redeem("host.memfd_token", *late, 5, Accept);
  EXPECT_EQ(expired.status().code(), absl::StatusCode::kNotFound);
  EXPECT_THAT(std::string(expired.status().message()), HasSubstr("token expired"));
}

// The sender can no longer shrink the memory the daemon maps (a SIGBUS in
// the daemon otherwise); growing stays allowed.
TEST(MemfdTokensTest, SealsTheMemfdAgainstShrinking) {
  MemfdTokens tokens(1000);
  const int fd = NewMemfd();
  const int mine = dup(fd);
  ASSERT_TRUE(tokens.Issue(fd, 0, 1).ok());
  EXPECT_TRUE(fcntl(mine, F_GET_SEALS) & F_SEAL_SHRINK);
  EXPECT_EQ(ftruncate(mine, 1024), -1);
  EXPECT_EQ(errno, EPERM);
  EXPECT_EQ(ftruncate(mine, 8192), 0);
  close(mine);
}

}  // namespace
}  // namespace indexer

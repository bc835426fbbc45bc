// Start-up checks (SPEC §9): every config integer range-checked with the
// field named (no value wraps when converted), the trust defaults, the K
// cache against the memory that can hold it, and loopback listening by
// default in the binary and every profile.
#include <cstdint>
#include <filesystem>
#include <functional>
#include <map>
#include <set>
#include <string>

#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "server/core/config_check.h"
#include "server/core/model.h"
#include "tests/integration/test_config.h"

namespace indexer::testing {
namespace {

using ::testing::HasSubstr;

struct RangeCase {
  const char* field;
  std::function<void(config::ServerConfig&, uint64_t)> set;
  uint64_t max_ok;   // the largest value accepted
  uint64_t too_big;  // refused
};

class ConfigRangeTest : public ::testing::TestWithParam<RangeCase> {};

TEST_P(ConfigRangeTest, AcceptsTheLimitRefusesPastItNamingTheField) {
  const RangeCase& c = GetParam();
  {
    config::ServerConfig cfg = MakeConfig({{.format = "fp8", .num_layers = 1, .pages = 4}});
    c.set(cfg, c.too_big);
    auto m = BuildModel(cfg);
    ASSERT_FALSE(m.ok()) << c.field;
    EXPECT_EQ(m.status().code(), absl::StatusCode::kInvalidArgument);
    EXPECT_THAT(std::string(m.status().message()), HasSubstr(std::string(c.field) + ": expected"));
    EXPECT_THAT(std::string(m.status().message()), HasSubstr(std::to_string(c.too_big)));
  }
  {
    config::ServerConfig cfg = MakeConfig({{.format = "fp8", .num_layers = 1, .pages = 4}});
    c.set(cfg, c.max_ok);
    EXPECT_TRUE(FillAndCheckLimits(&cfg).ok()) << c.field << " = " << c.max_ok;
  }
}

#define SETTER(expr) [](config::ServerConfig& c, uint64_t v) { expr; }
INSTANTIATE_TEST_SUITE_P(
    Fields, ConfigRangeTest,
    ::testing::Values(
        // 2^44 MiB << 20 is 2^64: it wrapped to 0 = unlimited before.
        RangeCase{"max_message_mb", SETTER(c.set_max_message_mb(v)), 2047, uint64_t{1} << 44},
        RangeCase{"next_n", SETTER(c.set_next_n(static_cast<uint32_t>(v))), 4, 5},
        RangeCase{"logits_budget_mb", SETTER(c.set_logits_budget_mb(v)), 1 << 20,
                  uint64_t{1} << 45},
        RangeCase{"max_open_steps", SETTER(c.set_max_open_steps(static_cast<uint32_t>(v))), 65536,
                  4000000000u},
        RangeCase{"max_batch", SETTER(c.set_max_batch(static_cast<uint32_t>(v))), 65536,
                  3000000000u},
        RangeCase{"max_q_len", SETTER(c.set_max_q_len(static_cast<uint32_t>(v))), 1 << 24,
                  2147483648u},
        RangeCase{"cache_mb", SETTER(c.set_cache_mb(v)), 1 << 20, uint64_t{1} << 50},
        RangeCase{"threads", SETTER(c.set_threads(static_cast<uint32_t>(v))), 4096, 4294967295u},
        RangeCase{"max_seq_len", SETTER(c.set_max_seq_len(v)), 1 << 30, uint64_t{1} << 40},
        RangeCase{"region_lease_ms", SETTER(c.set_region_lease_ms(v)), 86400000,
                  uint64_t{1} << 63},
        RangeCase{"step_idle_ms", SETTER(c.set_step_idle_ms(v)), 86400000, uint64_t{1} << 33},
        RangeCase{"sequence_idle_ttl_ms", SETTER(c.set_sequence_idle_ttl_ms(v)), 2592000000,
                  uint64_t{1} << 63},
        RangeCase{"drain_delay_ms", SETTER(c.set_drain_delay_ms(v)), 600000, 600001},
        RangeCase{"ring_spin_us", SETTER(c.set_ring_spin_us(static_cast<uint32_t>(v))), 100000,
                  100001},
        RangeCase{"keepalive_ms", SETTER(c.set_keepalive_ms(v)), 86400000, uint64_t{1} << 32},
        RangeCase{"keepalive_timeout_ms", SETTER(c.set_keepalive_timeout_ms(v)), 86400000,
                  uint64_t{1} << 32},
        RangeCase{"memory_quota_mb", SETTER(c.set_memory_quota_mb(v)), 1 << 20,
                  uint64_t{1} << 44},
        RangeCase{"client_quota.max_open_steps",
                  SETTER(c.mutable_client_quota()->set_max_open_steps(static_cast<uint32_t>(v))),
                  64, 70000},
        RangeCase{"client_quota.max_reserved_pct",
                  SETTER(c.mutable_client_quota()->set_max_reserved_pct(static_cast<uint32_t>(v))),
                  100, 101},
        RangeCase{"client_quota.max_bytes_in_flight_mb",
                  SETTER(c.mutable_client_quota()->set_max_bytes_in_flight_mb(v)), 1 << 20,
                  uint64_t{1} << 44},
        RangeCase{"tls.refresh_s", SETTER(c.mutable_tls()->set_refresh_s(static_cast<uint32_t>(v))),
                  86400, 86401},
        RangeCase{"groups[0].pages", SETTER(c.mutable_groups(0)->set_pages(v)), 4,
                  uint64_t{1} << 63},
        RangeCase{"groups[0].compress_ratio",
                  SETTER(c.mutable_groups(0)->set_compress_ratio(static_cast<uint32_t>(v))), 4,
                  4294967295u},
        RangeCase{"groups[0].head_dim",
                  SETTER(c.mutable_groups(0)->set_head_dim(static_cast<uint32_t>(v))), 128,
                  2147483648u},
        RangeCase{"groups[0].page_entries",
                  SETTER(c.mutable_groups(0)->set_page_entries(static_cast<uint32_t>(v))), 16,
                  2147483649u}),
    [](const ::testing::TestParamInfo<RangeCase>& i) {
      std::string n = i.param.field;
      for (char& ch : n) {
        if (!std::isalnum(static_cast<unsigned char>(ch))) ch = '_';
      }
      return n;
    });
#undef SETTER

TEST(ConfigCheckTest, TrustDefaults) {
  auto m = BuildModel(MakeConfig({{.format = "fp8", .num_layers = 1, .pages = 4}}));
  ASSERT_TRUE(m.ok()) << m.status();
  const config::ServerConfig& c = m->config;
  EXPECT_EQ(c.listen(), "127.0.0.1:50061");
  EXPECT_EQ(c.step_idle_ms(), 30000u);
  EXPECT_EQ(c.keepalive_ms(), 20000u);
  EXPECT_EQ(c.keepalive_timeout_ms(), 10000u);
  EXPECT_EQ(c.memory_quota_mb(), 4096u);
  EXPECT_EQ(c.client_id_header(), "x-indexer-client");
  EXPECT_EQ(c.client_quota().max_open_steps(), c.max_open_steps());
  EXPECT_EQ(c.client_quota().max_reserved_pct(), 50u);
  EXPECT_EQ(c.client_quota().max_bytes_in_flight_mb(), 1024u);
}

TEST(ConfigCheckTest, ClientIdHeaderMustBeAMetadataKey) {
  config::ServerConfig cfg = MakeConfig({{.format = "fp8", .num_layers = 1, .pages = 4}});
  cfg.set_client_id_header("X-Client\n");
  auto m = BuildModel(cfg);
  ASSERT_FALSE(m.ok());
  EXPECT_THAT(std::string(m.status().message()), HasSubstr("client_id_header: expected"));
  EXPECT_THAT(std::string(m.status().message()), HasSubstr("\\n"));  // escaped
}

TEST(ConfigCheckTest, CacheAboveMemoryIsRefused) {
  config::ServerConfig cfg = MakeConfig({{.format = "fp8", .num_layers = 2, .pages = 0}});
  cfg.set_cache_mb(64);
  auto m = BuildModel(cfg);
  ASSERT_TRUE(m.ok()) << m.status();
  const int64_t pools = PoolBytes(*m);
  EXPECT_GT(pools, (int64_t{63} << 20));
  EXPECT_LE(pools, (int64_t{64} << 20));
  EXPECT_TRUE(CheckCacheFits(*m, pools, "test memory").ok());
  absl::Status s = CheckCacheFits(*m, int64_t{32} << 20, "test memory");
  EXPECT_EQ(s.code(), absl::StatusCode::kResourceExhausted);
  EXPECT_THAT(std::string(s.message()), HasSubstr("cache_mb: the K pools take 6"));
  EXPECT_THAT(std::string(s.message()), HasSubstr("expected at most the 32 MiB of test memory"));
  // This host: some memory, and far less than a 4 TiB cache.
  auto avail = HostAvailableBytes();
  ASSERT_TRUE(avail.ok()) << avail.status();
  EXPECT_GT(*avail, 0);
  cfg.set_cache_mb(uint64_t{1} << 22);
  auto huge = BuildModel(cfg);
  ASSERT_TRUE(huge.ok()) << huge.status();
  EXPECT_EQ(CheckCacheFits(*huge, *avail, "host").code(), absl::StatusCode::kResourceExhausted);
}

// Every shipped profile listens on loopback unless told otherwise.
TEST(ConfigCheckTest, EveryProfileListensOnLoopback) {
  int profiles = 0;
  for (const auto& entry : std::filesystem::directory_iterator(INDEXER_CONFIG_DIR)) {
    if (entry.path().extension() != ".textproto") continue;
    auto cfg = LoadConfigFile(entry.path().string());
    ASSERT_TRUE(cfg.ok()) << cfg.status();
    cfg->set_cache_mb(64);  // the pools' size does not matter here
    auto m = BuildModel(*cfg);
    ASSERT_TRUE(m.ok()) << entry.path() << ": " << m.status();
    EXPECT_EQ(m->config.listen().rfind("127.0.0.1:", 0), 0u) << entry.path();
    ++profiles;
  }
  EXPECT_GE(profiles, 5);
}

// The layer roles of every shipped profile, as runs "first-last role" (one
// layer: "n role"). A profile added to deploy/configs must be pinned here.
// V4.1's map is seed 002's: layer 20 writes the candidate pools of layers 24
// to 36, every other layer is dense.
std::string RoleRuns(const Model& m) {
  std::string out;
  int32_t n = m.num_layers();
  for (int32_t b = 0; b < n;) {
    int32_t e = b;
    while (e + 1 < n && m.layer_role[e + 1].kind == m.layer_role[b].kind &&
           m.layer_role[e + 1].set == m.layer_role[b].set) {
      ++e;
    }
    if (!out.empty()) out += ", ";
    out += std::to_string(b);
    if (e > b) out += "-" + std::to_string(e);
    out += std::string(" ") + LayerRoleName(m.layer_role[b].kind);
    b = e + 1;
  }
  return out;
}

TEST(ConfigCheckTest, EveryShippedProfilePinsItsLayerRoles) {
  const std::map<std::string, std::string> expected = {
      {"demo", "0 dense, 1 candidate_source, 2 candidate_consumer, 3-4 dense, 5-6 block"},
      {"deepseek-v3.2-fp8", "0-60 dense"},
      {"deepseek-v4.1-fp8",
       "0-19 dense, 20 candidate_source, 21-23 dense, 24-36 candidate_consumer, 37-60 dense"},
      {"deepseek-v4.1-mxfp4",
       "0-19 dense, 20 candidate_source, 21-23 dense, 24-36 candidate_consumer, 37-60 dense"},
      {"minimax-m3-mxfp4", "0-61 block"},
  };
  std::set<std::string> seen;
  for (const auto& entry : std::filesystem::directory_iterator(INDEXER_CONFIG_DIR)) {
    if (entry.path().extension() != ".textproto") continue;
    auto cfg = LoadConfigFile(entry.path().string());
    ASSERT_TRUE(cfg.ok()) << cfg.status();
    cfg->set_cache_mb(64);
    auto m = BuildModel(*cfg);
    ASSERT_TRUE(m.ok()) << entry.path() << ": " << m.status();
    const std::string name = entry.path().stem().string();
    EXPECT_EQ(m->config.profile(), name) << entry.path();
    auto it = expected.find(name);
    ASSERT_NE(it, expected.end()) << entry.path() << " has no pinned layer roles";
    EXPECT_EQ(RoleRuns(*m), it->second) << entry.path();
    seen.insert(name);
  }
  EXPECT_EQ(seen.size(), expected.size()) << "a pinned profile is missing from deploy/configs";
  // Every consumer reads its own set's source, which runs before it.
  auto v41 = LoadConfigFile(std::string(INDEXER_CONFIG_DIR) + "/deepseek-v4.1-fp8.textproto");
  ASSERT_TRUE(v41.ok()) << v41.status();
  v41->set_cache_mb(64);
  auto m = BuildModel(*v41);
  ASSERT_TRUE(m.ok()) << m.status();
  ASSERT_EQ(m->candidate_sets.size(), 1u);
  EXPECT_EQ(m->candidate_sets[0].source_layer, 20);
  EXPECT_EQ(m->candidate_sets[0].consumers,
            (std::vector<int32_t>{24, 25, 26, 27, 28, 29, 30, 31, 32, 33, 34, 35, 36}));
  EXPECT_EQ(m->layer_role[30].set, 0);
}

}  // namespace
}  // namespace indexer::testing

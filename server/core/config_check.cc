#include "server/core/config_check.h"

#include <algorithm>
#include <cctype>

#include <unistd.h>

#include <fstream>
#include <string>

#include "absl/strings/escaping.h"
#include "absl/strings/numbers.h"
#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "absl/strings/strip.h"
#include "kernels/common/status_macros.h"
#include "server/core/model.h"

namespace indexer {
namespace {

// `value` within [lo, hi], else INVALID_ARGUMENT naming `field`.
absl::Status InRange(const char* field, uint64_t value, uint64_t lo, uint64_t hi,
                     const char* why = "") {
  if (value >= lo && value <= hi) return absl::OkStatus();
  return absl::InvalidArgumentError(absl::StrCat(field, ": expected ", lo, "..", hi, why,
                                                 ", got ", value));
}

}  // namespace

absl::Status FillAndCheckLimits(config::ServerConfig* cfg) {
  // Ranges first, on the values as written: a value whose conversion would
  // wrap (2^44 MiB << 20) is refused before anything converts it.
  RETURN_IF_ERROR(InRange("next_n", cfg->next_n(), 0, 4));
  RETURN_IF_ERROR(InRange("logits_budget_mb", cfg->logits_budget_mb(), 0, 1 << 20));
  // gRPC takes the message limit as an int of bytes.
  RETURN_IF_ERROR(InRange("max_message_mb", cfg->max_message_mb(), 0, 2047,
                          " (gRPC's limit is an int of bytes)"));
  RETURN_IF_ERROR(InRange("max_open_steps", cfg->max_open_steps(), 0, 65536));
  RETURN_IF_ERROR(InRange("max_batch", cfg->max_batch(), 0, 65536));
  RETURN_IF_ERROR(InRange("max_q_len", cfg->max_q_len(), 0, 1 << 24));
  RETURN_IF_ERROR(InRange("cache_mb", cfg->cache_mb(), 0, uint64_t{1} << 30));
  RETURN_IF_ERROR(InRange("threads", cfg->threads(), 0, 4096));
  RETURN_IF_ERROR(InRange("max_seq_len", cfg->max_seq_len(), 0, uint64_t{1} << 30));
  RETURN_IF_ERROR(InRange("region_lease_ms", cfg->region_lease_ms(), 0, 86400000));
  RETURN_IF_ERROR(InRange("memfd_token_ttl_ms", cfg->memfd_token_ttl_ms(), 0, 3600000));
  // Timers take milliseconds as an int (gRPC's keepalive arguments).
  RETURN_IF_ERROR(InRange("step_idle_ms", cfg->step_idle_ms(), 0, 86400000));
  RETURN_IF_ERROR(InRange("keepalive_ms", cfg->keepalive_ms(), 0, 86400000));
  RETURN_IF_ERROR(InRange("keepalive_timeout_ms", cfg->keepalive_timeout_ms(), 0, 86400000));
  RETURN_IF_ERROR(InRange("memory_quota_mb", cfg->memory_quota_mb(), 0, uint64_t{1} << 30));
  const config::ClientQuota& q = cfg->client_quota();
  RETURN_IF_ERROR(InRange("client_quota.max_open_steps", q.max_open_steps(), 0, 65536));
  RETURN_IF_ERROR(InRange("client_quota.max_reserved_pct", q.max_reserved_pct(), 0, 100));
  RETURN_IF_ERROR(InRange("client_quota.max_bytes_in_flight_mb", q.max_bytes_in_flight_mb(), 0,
                          uint64_t{1} << 30));
  RETURN_IF_ERROR(InRange("tls.refresh_s", cfg->tls().refresh_s(), 0, 86400));
  // Lifecycle timers: milliseconds held in an int64 duration, 30 days at most.
  RETURN_IF_ERROR(InRange("sequence_idle_ttl_ms", cfg->sequence_idle_ttl_ms(), 0, 2592000000));
  // Kubernetes' terminationGracePeriodSeconds must cover it: 10 minutes at most.
  RETURN_IF_ERROR(InRange("drain_delay_ms", cfg->drain_delay_ms(), 0, 600000));
  RETURN_IF_ERROR(InRange("layer_spin_us", cfg->layer_spin_us(), 0, 100000));
  RETURN_IF_ERROR(InRange("ring_spin_us", cfg->ring_spin_us(), 0, 100000));

  if (cfg->next_n() == 0) cfg->set_next_n(1);
  if (cfg->logits_budget_mb() == 0) cfg->set_logits_budget_mb(512);
  if (cfg->max_message_mb() == 0) cfg->set_max_message_mb(256);
  if (cfg->max_open_steps() == 0) cfg->set_max_open_steps(64);
  if (cfg->max_batch() == 0) cfg->set_max_batch(1024);
  if (cfg->max_q_len() == 0) cfg->set_max_q_len(65536);
  if (cfg->cache_mb() == 0) cfg->set_cache_mb(2048);
  if (cfg->listen().empty()) cfg->set_listen(kDefaultListen);
  if (cfg->device().empty()) cfg->set_device("auto");
  if (cfg->max_seq_len() == 0) cfg->set_max_seq_len(1 << 20);
  if (cfg->step_idle_ms() == 0) cfg->set_step_idle_ms(kDefaultStepIdleMs);
  if (!cfg->has_layer_spin_us()) cfg->set_layer_spin_us(kDefaultLayerSpinUs);
  if (!cfg->has_ring_spin_us()) cfg->set_ring_spin_us(kDefaultRingSpinUs);
  if (cfg->keepalive_ms() == 0) cfg->set_keepalive_ms(kDefaultKeepaliveMs);
  if (cfg->keepalive_timeout_ms() == 0) cfg->set_keepalive_timeout_ms(kDefaultKeepaliveTimeoutMs);
  if (cfg->memory_quota_mb() == 0) cfg->set_memory_quota_mb(kDefaultMemoryQuotaMb);
  if (cfg->client_id_header().empty()) cfg->set_client_id_header(kDefaultClientIdHeader);
  if (!cfg->has_drain_delay_ms()) cfg->set_drain_delay_ms(kDefaultDrainDelayMs);
  config::ClientQuota* mq = cfg->mutable_client_quota();
  if (mq->max_open_steps() == 0) mq->set_max_open_steps(cfg->max_open_steps());
  if (mq->max_reserved_pct() == 0) mq->set_max_reserved_pct(kDefaultMaxReservedPct);
  if (mq->max_bytes_in_flight_mb() == 0) mq->set_max_bytes_in_flight_mb(kDefaultMaxBytesInFlightMb);
  if (mq->max_open_steps() > cfg->max_open_steps()) {
    return absl::InvalidArgumentError(absl::StrCat(
        "client_quota.max_open_steps: expected at most max_open_steps = ",
        cfg->max_open_steps(), ", got ", mq->max_open_steps()));
  }
  // gRPC metadata keys are lower-case: "X-Tenant" names the key "x-tenant".
  std::string header = cfg->client_id_header();
  for (char& c : header) c = static_cast<char>(std::tolower(static_cast<unsigned char>(c)));
  const bool header_ok =
      !absl::EndsWith(header, "-bin") && !absl::StartsWith(header, "grpc-") &&
      std::all_of(header.begin(), header.end(), [](char c) {
        return (c >= 'a' && c <= 'z') || (c >= '0' && c <= '9') || c == '-' || c == '_' || c == '.';
      });
  if (!header_ok) {
    return absl::InvalidArgumentError(absl::StrCat(
        "client_id_header: expected a metadata key ([A-Za-z0-9-_.], not grpc-*, not *-bin), got \"",
        absl::CEscape(cfg->client_id_header()), "\""));
  }
  cfg->set_client_id_header(header);
  return absl::OkStatus();
}

int64_t PoolBytes(const Model& model) {
  int64_t bytes = 0;
  for (const GroupSpec& g : model.groups) {
    bytes += g.pages * g.layout.page_bytes() * static_cast<int64_t>(g.layers.size());
  }
  return bytes;
}

absl::Status CheckCacheFits(const Model& model, int64_t available_bytes,
                            const std::string& where) {
  const int64_t need = PoolBytes(model);
  if (need <= available_bytes) return absl::OkStatus();
  return absl::ResourceExhaustedError(absl::StrCat(
      "cache_mb: the K pools take ", need >> 20, " MiB (cache_mb = ", model.config.cache_mb(),
      " plus groups with explicit pages); expected at most the ", available_bytes >> 20,
      " MiB of ", where));
}

absl::StatusOr<int64_t> HostAvailableBytes() {
  std::ifstream in("/proc/meminfo");
  std::string line;
  while (std::getline(in, line)) {
    absl::string_view rest = line;
    if (!absl::ConsumePrefix(&rest, "MemAvailable:")) continue;
    rest = absl::StripAsciiWhitespace(rest);
    absl::ConsumeSuffix(&rest, "kB");
    int64_t kb = 0;
    if (absl::SimpleAtoi(absl::StripAsciiWhitespace(rest), &kb)) return kb * 1024;
  }
  const long pages = sysconf(_SC_PHYS_PAGES);
  const long page = sysconf(_SC_PAGE_SIZE);
  if (pages > 0 && page > 0) return static_cast<int64_t>(pages) * page;
  return absl::NotFoundError("host memory: neither /proc/meminfo nor sysconf answered");
}

}  // namespace indexer

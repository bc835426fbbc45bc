// Per-client quotas (SPEC §6 "Clients and tenancy", §9): open steps, pages
// reserved by a client's open steps in each layer group, and request bytes
// being handled. A refusal is RESOURCE_EXHAUSTED naming the quota, the
// client and the limit:
//   client_quota.max_open_steps: client "x" has 4 open steps, limit 4
//
// Clients are keyed by ClientIdentity (server/rpc/identity.h). Anonymous
// callers ("", no identity header and no client certificate) share ONE
// quota: keying them by peer address would let a single caller multiply its
// share by opening connections, so the anonymous share is bounded as a
// whole; front-ends that must not starve each other name themselves.
//
// Thread safety: thread-safe. Holds release what they took when destroyed.
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/container/flat_hash_map.h"
#include "absl/status/status.h"
#include "absl/synchronization/mutex.h"

namespace indexer {

struct QuotaLimits {
  int64_t max_open_steps = 0;
  int64_t max_reserved_pct = 0;      // of each group's pages
  int64_t max_bytes_in_flight = 0;   // bytes
};

class ClientQuotas {
 public:
  // `group_pages[g]` = total pages of group g, `group_names[g]` its name.
  ClientQuotas(QuotaLimits limits, std::vector<int64_t> group_pages,
               std::vector<std::string> group_names);

  // What one call or stream holds of its client's quota; returns it when
  // destroyed (or on Reset). Movable, not copyable.
  class Hold {
   public:
    Hold() = default;
    Hold(Hold&& o) noexcept { *this = std::move(o); }
    Hold& operator=(Hold&& o) noexcept;
    ~Hold() { Reset(); }
    void Reset();
    bool empty() const { return owner_ == nullptr; }

   private:
    friend class ClientQuotas;
    ClientQuotas* owner_ = nullptr;
    std::string client_;
    int64_t steps_ = 0;
    std::vector<int64_t> pages_;  // [group]
    int64_t bytes_ = 0;
  };

  // One open step for `client`; RESOURCE_EXHAUSTED at the limit.
  absl::Status OpenStep(const std::string& client, Hold* hold);
  // Adds `pages[g]` reserved pages to what `hold` (a step's) holds; refused
  // (nothing taken) when the client's pages in a group would pass
  // max_reserved_pct of it.
  absl::Status ReservePages(const std::vector<int64_t>& pages, Hold* hold);
  // `bytes` of request being handled; refused when the client's bytes in
  // flight would pass the limit.
  absl::Status TakeBytes(const std::string& client, int64_t bytes, Hold* hold);

  // The client's current use, for tests and logs.
  int64_t open_steps(const std::string& client) const;
  int64_t bytes_in_flight(const std::string& client) const;
  int64_t reserved_pages(const std::string& client, size_t group) const;

  // How a client appears in messages: escaped and capped ("anonymous" for "").
  static std::string Display(const std::string& client);

 private:
  struct Use {
    int64_t steps = 0;
    std::vector<int64_t> pages;
    int64_t bytes = 0;
    bool idle() const;
  };
  void Give(Hold* hold);
  Use& UseOf(const std::string& client) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);

  const QuotaLimits limits_;
  const std::vector<int64_t> group_pages_;
  const std::vector<std::string> group_names_;
  mutable absl::Mutex mu_;
  absl::flat_hash_map<std::string, Use> use_ ABSL_GUARDED_BY(mu_);
};

}  // namespace indexer

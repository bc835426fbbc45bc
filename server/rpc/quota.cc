#include "server/rpc/quota.h"

#include <utility>

#include "absl/strings/str_cat.h"
#include "server/rpc/log_safe.h"

namespace indexer {

ClientQuotas::ClientQuotas(QuotaLimits limits, std::vector<int64_t> group_pages,
                           std::vector<std::string> group_names)
    : limits_(limits),
      group_pages_(std::move(group_pages)),
      group_names_(std::move(group_names)) {}

ClientQuotas::Hold& ClientQuotas::Hold::operator=(Hold&& o) noexcept {
  if (this != &o) {
    Reset();
    owner_ = o.owner_;
    client_ = std::move(o.client_);
    steps_ = o.steps_;
    pages_ = std::move(o.pages_);
    bytes_ = o.bytes_;
    o.owner_ = nullptr;
  }
  return *this;
}

void ClientQuotas::Hold::Reset() {
  if (owner_ != nullptr) owner_->Give(this);
  owner_ = nullptr;
  steps_ = 0;
  pages_.clear();
  bytes_ = 0;
}

bool ClientQuotas::Use::idle() const {
  if (steps != 0 || bytes != 0) return false;
  for (int64_t p : pages) {
    if (p != 0) return false;
  }
  return true;
}

std::string ClientQuotas::Display(const std::string& client) {
  if (client.empty()) return "anonymous";
  return absl::StrCat("\"", LogSafe(client, 128), "\"");
}

ClientQuotas::Use& ClientQuotas::UseOf(const std::string& client) {
  Use& u = use_[client];
  if (u.pages.empty()) u.pages.assign(group_pages_.size(), 0);
  return u;
}

absl::Status ClientQuotas::OpenStep(const std::string& client, Hold* hold) {
  absl::MutexLock lock(&mu_);
  Use& u = UseOf(client);
  if (u.steps + 1 > limits_.max_open_steps) {
    const int64_t have = u.steps;
    if (u.idle()) use_.erase(client);
    return absl::ResourceExhaustedError(absl::StrCat(
        "client_quota.max_open_steps: client ", Display(client), " has ", have,
        " open steps, limit ", limits_.max_open_steps));
  }
  ++u.steps;
  if (hold->owner_ == nullptr) {
    hold->owner_ = this;
    hold->client_ = client;
  }
  ++hold->steps_;
  return absl::OkStatus();
}

absl::Status ClientQuotas::ReservePages(const std::vector<int64_t>& pages, Hold* hold) {
  absl::MutexLock lock(&mu_);
  Use& u = UseOf(hold->client_);
  for (size_t g = 0; g < pages.size() && g < group_pages_.size(); ++g) {
    const int64_t limit = group_pages_[g] * limits_.max_reserved_pct / 100;
    if (pages[g] > 0 && u.pages[g] + pages[g] > limit) {
      return absl::ResourceExhaustedError(absl::StrCat(
          "client_quota.max_reserved_pct: client ", Display(hold->client_), " has ", u.pages[g],
          " pages of layer group '", group_names_[g], "' reserved by open steps and this step needs ",
          pages[g], " more, limit ", limit, " (", limits_.max_reserved_pct, "% of ",
          group_pages_[g], ")"));
    }
  }
  if (hold->owner_ == nullptr) hold->owner_ = this;
  if (hold->pages_.empty()) hold->pages_.assign(group_pages_.size(), 0);
  for (size_t g = 0; g < pages.size() && g < group_pages_.size(); ++g) {
    u.pages[g] += pages[g];
    hold->pages_[g] += pages[g];
  }
  return absl::OkStatus();
}

absl::Status ClientQuotas::TakeBytes(const std::string& client, int64_t bytes, Hold* hold) {
  absl::MutexLock lock(&mu_);
  Use& u = UseOf(client);
  if (u.bytes + bytes > limits_.max_bytes_in_flight) {
    const int64_t have = u.bytes;
    if (u.idle()) use_.erase(client);
    return absl::ResourceExhaustedError(absl::StrCat(
        "client_quota.max_bytes_in_flight_mb: client ", Display(client), " has ", have,
        " request bytes in flight and this request adds ", bytes, ", limit ",
        limits_.max_bytes_in_flight, " bytes"));
  }
  u.bytes += bytes;
  if (hold->owner_ == nullptr) {
    hold->owner_ = this;
    hold->client_ = client;
  }
  hold->bytes_ += bytes;
  return absl::OkStatus();
}

void ClientQuotas::Give(Hold* hold) {
  absl::MutexLock lock(&mu_);
  auto it = use_.find(hold->client_);
  if (it == use_.end()) return;
  Use& u = it->second;
  u.steps -= hold->steps_;
  u.bytes -= hold->bytes_;
  for (size_t g = 0; g < hold->pages_.size() && g < u.pages.size(); ++g) {
    u.pages[g] -= hold->pages_[g];
  }
  // Entries of clients that hold nothing go, so that names do not pile up.
  if (u.idle()) use_.erase(it);
}

int64_t ClientQuotas::open_steps(const std::string& client) const {
  absl::MutexLock lock(&mu_);
  auto it = use_.find(client);
  return it == use_.end() ? 0 : it->second.steps;
}

int64_t ClientQuotas::bytes_in_flight(const std::string& client) const {
  absl::MutexLock lock(&mu_);
  auto it = use_.find(client);
  return it == use_.end() ? 0 : it->second.bytes;
}

int64_t ClientQuotas::reserved_pages(const std::string& client, size_t group) const {
  absl::MutexLock lock(&mu_);
  auto it = use_.find(client);
  return it == use_.end() || group >= it->second.pages.size() ? 0 : it->second.pages[group];
}

}  // namespace indexer

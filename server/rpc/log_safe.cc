#include "server/rpc/log_safe.h"

#include "absl/strings/escaping.h"
#include "absl/strings/str_cat.h"

namespace indexer {

std::string CapText(absl::string_view s, size_t max) {
  if (s.size() <= max) return std::string(s);
  // The suffix is at most 32 bytes ("... (" + 20 digits + " bytes cut)").
  const size_t keep = max > 32 ? max - 32 : 0;
  return absl::StrCat(s.substr(0, keep), "... (", s.size() - keep, " bytes cut)");
}

std::string LogSafe(absl::string_view s, size_t max) {
  // Escaping at most quadruples a byte: escape only what can be kept.
  return CapText(absl::CEscape(s.substr(0, max)), max) +
         (s.size() > max ? absl::StrCat("... (", s.size(), " bytes)") : "");
}

bool RateLimiter::Allow(Clock::time_point now, int64_t* suppressed) {
  absl::MutexLock lock(&mu_);
  if (any_ && now - last_ < period_) {
    ++suppressed_;
    return false;
  }
  any_ = true;
  last_ = now;
  *suppressed = suppressed_;
  suppressed_ = 0;
  return true;
}

}  // namespace indexer

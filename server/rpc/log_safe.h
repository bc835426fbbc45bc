// Text from clients in logs and statuses (SPEC §9: logs cannot be forged
// through names or request ids): escaped so that a newline cannot start a
// forged line, and capped so that a 1 MB shape cannot make a 1 MB line.
#pragma once

#include <chrono>
#include <cstddef>
#include <cstdint>
#include <string>

#include "absl/base/thread_annotations.h"
#include "absl/strings/string_view.h"
#include "absl/synchronization/mutex.h"

namespace indexer {

// Longest error text the daemon sends or logs.
inline constexpr size_t kMaxErrorBytes = 1024;

// `s` cut to at most `max` bytes; a cut text ends with
// "... (N bytes cut)" and the whole result stays within `max` (for max >= 32).
std::string CapText(absl::string_view s, size_t max = kMaxErrorBytes);

// `s` C-escaped (\n, \", \x01 ...) and then capped by CapText: safe inside
// one log line or a quoted name.
std::string LogSafe(absl::string_view s, size_t max = 256);

// At most one message per `period`; the calls in between are counted and
// reported by the next one that is let through. For repeated rejections
// (admission, quotas) under a flood.
//
// Thread safety: thread-safe.
class RateLimiter {
 public:
  using Clock = std::chrono::steady_clock;
  explicit RateLimiter(Clock::duration period = std::chrono::seconds(1)) : period_(period) {}
  // True when this event may be logged; then `*suppressed` = events not
  // logged since the last one that was.
  bool Allow(Clock::time_point now, int64_t* suppressed);
  bool Allow(int64_t* suppressed) { return Allow(Clock::now(), suppressed); }

 private:
  const Clock::duration period_;
  absl::Mutex mu_;
  bool any_ ABSL_GUARDED_BY(mu_) = false;
  Clock::time_point last_ ABSL_GUARDED_BY(mu_);
  int64_t suppressed_ ABSL_GUARDED_BY(mu_) = 0;
};

}  // namespace indexer

#include "server/rpc/idle_watch.h"

#include <algorithm>

#include "absl/time/time.h"

namespace indexer {

IdleWatch::IdleWatch(std::chrono::milliseconds idle)
    : idle_(idle),
      tick_(std::clamp(idle / 8, std::chrono::milliseconds(1), std::chrono::milliseconds(250))),
      thread_([this] { Loop(); }) {}

IdleWatch::~IdleWatch() {
  {
    absl::MutexLock lock(&mu_);
    stopping_ = true;
  }
  thread_.join();
}

void IdleWatch::Add(IdleWatched* w) {
  absl::MutexLock lock(&mu_);
  watched_.insert(w);
}

void IdleWatch::Remove(IdleWatched* w) {
  absl::MutexLock lock(&mu_);
  watched_.erase(w);
}

void IdleWatch::Loop() {
  absl::MutexLock lock(&mu_);
  while (!stopping_) {
    // Waits one tick, or less when the watch is being destroyed.
    mu_.AwaitWithTimeout(absl::Condition(&stopping_), absl::FromChrono(tick_));
    if (stopping_) break;
    const auto deadline = std::chrono::steady_clock::now() - idle_;
    for (IdleWatched* w : watched_) w->ExpireIfIdleSince(deadline);
  }
}

}  // namespace indexer

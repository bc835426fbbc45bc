// One thread that ends idle step streams (SPEC §6: a step that receives
// nothing for a configured time is rolled back). Streams register while they
// live; every `tick` the thread asks each one whether it has been waiting
// for a message longer than its limit, and the stream ends itself (rollback,
// then its status). No thread or timer per step.
//
// Thread safety: thread-safe. Lock order: the watch's lock, then a stream's.
#pragma once

#include <chrono>
#include <thread>

#include "absl/base/thread_annotations.h"
#include "absl/container/flat_hash_set.h"
#include "absl/synchronization/mutex.h"

namespace indexer {

class IdleWatched {
 public:
  virtual ~IdleWatched() = default;
  // Ends the stream when it has waited for a message since before
  // `deadline`. Called with the watch's lock held: must not call back into
  // the watch.
  virtual void ExpireIfIdleSince(std::chrono::steady_clock::time_point deadline) = 0;
};

class IdleWatch {
 public:
  // Streams idle for `idle` end; checked every idle / 8 (at least 1 ms, at
  // most 250 ms), so a stream ends within idle * 1.125 or idle + 250 ms.
  explicit IdleWatch(std::chrono::milliseconds idle);
  ~IdleWatch();
  IdleWatch(const IdleWatch&) = delete;
  IdleWatch& operator=(const IdleWatch&) = delete;

  std::chrono::milliseconds idle() const { return idle_; }
  void Add(IdleWatched* w);
  // After Remove returns, the watch never calls `w` again.
  void Remove(IdleWatched* w);

 private:
  void Loop();

  const std::chrono::milliseconds idle_;
  const std::chrono::milliseconds tick_;
  absl::Mutex mu_;
  absl::flat_hash_set<IdleWatched*> watched_ ABSL_GUARDED_BY(mu_);
  bool stopping_ ABSL_GUARDED_BY(mu_) = false;
  std::thread thread_;
};

}  // namespace indexer

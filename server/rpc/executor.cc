#include "server/rpc/executor.h"

#include <sys/resource.h>
#include <unistd.h>

#include <string>
#include <utility>

namespace indexer {

Executor::Executor(int workers, int nice, absl::Duration spin) : spin_(spin) {
  if (workers < 1) workers = 1;
  threads_.reserve(workers);
  for (int i = 0; i < workers; ++i) {
    threads_.emplace_back([this, nice] {
      // Best effort: without it the workers only compete as equals.
      if (nice != 0) (void)setpriority(PRIO_PROCESS, static_cast<id_t>(gettid()), nice);
      Loop();
    });
  }
}

Executor::~Executor() {
  {
    absl::MutexLock lock(&mu_);
    stopping_ = true;
  }
  for (std::thread& t : threads_) t.join();
}

void Executor::Post(std::function<void()> task) {
  {
    absl::MutexLock lock(&mu_);
    if (!stopping_) {
      queue_.push_back(std::move(task));
      queued_.store(static_cast<int64_t>(queue_.size()), std::memory_order_release);
      return;
    }
  }
  task();
}

size_t Executor::queued() const {
  absl::MutexLock lock(&mu_);
  return queue_.size();
}

bool Executor::SpinForWork() const {
  if (spin_ <= absl::ZeroDuration()) return false;
  const absl::Time until = absl::Now() + spin_;
  do {
    for (int i = 0; i < 64; ++i) {
      if (queued_.load(std::memory_order_acquire) > 0) return true;
#if defined(__x86_64__)
      __builtin_ia32_pause();
#endif
    }
  } while (absl::Now() < until);
  return false;
}

void Executor::Loop() {
  for (;;) {
    std::function<void()> task;
    // After a task, poll briefly before sleeping (the next layer of the
    // step is usually one client round trip away).
    const bool maybe = SpinForWork();
    {
      absl::MutexLock lock(&mu_);
      // Another worker took it: poll again rather than sleep.
      if (maybe && queue_.empty() && !stopping_) continue;
      mu_.Await(absl::Condition(
          +[](Executor* e) ABSL_EXCLUSIVE_LOCKS_REQUIRED(e->mu_) {
            return e->stopping_ || !e->queue_.empty();
          },
          this));
      if (queue_.empty()) return;  // stopping, and nothing left
      task = std::move(queue_.front());
      queue_.pop_front();
      queued_.store(static_cast<int64_t>(queue_.size()), std::memory_order_release);
    }
    task();
  }
}

int ExecutorWorkersFor(const std::string& backend_kind) {
  (void)backend_kind;  // the same two for both kinds today (see the header)
  return 2;
}

}  // namespace indexer

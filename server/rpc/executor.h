// The layer executor: a small pool of worker threads, one per device, that
// runs layer work (Step::RunLayer, Commit, WriteEntries' import) so that
// gRPC's callback threads never block on the device or on the cpu backend's
// threads. Health checks and GetServerInfo keep answering while the workers
// are busy (SPEC §9: the control plane answers while the device is
// saturated).
//
// Thread safety: Post may be called from any thread. Tasks run in FIFO order
// on whichever worker is free; a task must not block on another task.
#pragma once

#include <atomic>
#include <cstdint>
#include <deque>
#include <functional>
#include <thread>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"

namespace indexer {

class Executor {
 public:
  // Starts `workers` threads (>= 1) at `nice` (Linux: per thread; threads
  // they start, such as the cpu backend's TBB workers, inherit it). A
  // positive nice makes layer work yield the CPU to gRPC's threads, so that
  // health checks are answered at once even on a saturated host.
  // `spin`: a worker that finished a task polls for the next one this long
  // before it sleeps. The layers of a step arrive one round trip apart, and
  // a sleeping worker's wake-up (a futex and, on an idle host, a core
  // leaving its sleep state) costs tens of microseconds per layer; the spin
  // trades a core per busy worker, while steps run, for that latency.
  explicit Executor(int workers, int nice = 0, absl::Duration spin = absl::ZeroDuration());
  // Runs the tasks already posted, then joins the workers.
  ~Executor();
  Executor(const Executor&) = delete;
  Executor& operator=(const Executor&) = delete;

  // Queues `task`. After the destructor has begun, the task runs inline
  // (nothing is dropped: a dropped task would leak a stream's reactor).
  void Post(std::function<void()> task);

  int workers() const { return static_cast<int>(threads_.size()); }
  // Tasks queued and not yet started.
  size_t queued() const;

 private:
  void Loop();

  // Polls queued_ for up to spin_; true when a task may be waiting.
  bool SpinForWork() const;

  const absl::Duration spin_;
  std::atomic<int64_t> queued_{0};  // queue_.size(), for the spinning workers
  mutable absl::Mutex mu_;
  std::deque<std::function<void()>> queue_ ABSL_GUARDED_BY(mu_);
  bool stopping_ ABSL_GUARDED_BY(mu_) = false;
  std::vector<std::thread> threads_;
};

// Workers per device for a backend kind: the cpu backend spreads each call
// over its own thread arena, so two workers keep it fed while one call
// finishes; a GPU takes one stream of work per worker, and two overlap the
// host side of one layer with the device side of another.
int ExecutorWorkersFor(const std::string& backend_kind);

// The nice of layer workers (see Executor).
inline constexpr int kLayerWorkerNice = 10;

}  // namespace indexer

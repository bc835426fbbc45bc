#include "kernels/host_buffers.h"

#include <cstdlib>
#include <map>
#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/synchronization/mutex.h"

namespace indexer {

struct HostLease::State {
  State(HostBufferPool::AllocFn a, HostBufferPool::FreeFn f, HostBufferPool::Limits l)
      : alloc(std::move(a)), free(std::move(f)), limits(l) {}

  // Takes a buffer of class `cap`: an idle one, else a new one after freeing
  // idle buffers of other classes while a bound would be crossed. Null when
  // nothing fits.
  uint8_t* Take(int64_t cap) {
    absl::MutexLock lock(&mu);
    ++stats.lends;
    if (shut) return Refuse();
    auto it = idle.find(cap);
    if (it != idle.end() && !it->second.empty()) {
      uint8_t* p = it->second.back();
      it->second.pop_back();
      lent.emplace(p, cap);
      ++stats.reuses;
      return p;
    }
    if (cap > limits.max_bytes) return Refuse();
    while (stats.buffers + 1 > limits.max_buffers || stats.bytes + cap > limits.max_bytes) {
      if (!FreeOneIdle()) return Refuse();
    }
    auto* p = static_cast<uint8_t*>(alloc(static_cast<size_t>(cap)));
    if (p == nullptr) return Refuse();
    ++stats.buffers;
    stats.bytes += cap;
    lent.emplace(p, cap);
    return p;
  }

  void Give(uint8_t* p, int64_t cap) {
    absl::MutexLock lock(&mu);
    lent.erase(p);
    if (shut) {
      free(p);
      --stats.buffers;
      stats.bytes -= cap;
      return;
    }
    idle[cap].push_back(p);
  }

  bool Contains(const void* p, int64_t bytes) const {
    const auto* b = static_cast<const uint8_t*>(p);
    absl::MutexLock lock(&mu);
    // The lent buffer at or below p (at most 16 exist).
    auto it = lent.upper_bound(const_cast<uint8_t*>(b));
    if (it == lent.begin()) return false;
    --it;
    return b + bytes <= it->first + it->second;
  }

  void Shutdown() {
    absl::MutexLock lock(&mu);
    shut = true;
    while (FreeOneIdle()) {
    }
  }

  uint8_t* Refuse() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu) {
    ++stats.refusals;
    return nullptr;
  }

  // Frees one idle buffer, the largest first (it makes the most room).
  bool FreeOneIdle() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu) {
    for (auto it = idle.rbegin(); it != idle.rend(); ++it) {
      if (it->second.empty()) continue;
      free(it->second.back());
      it->second.pop_back();
      --stats.buffers;
      stats.bytes -= it->first;
      return true;
    }
    return false;
  }

  const HostBufferPool::AllocFn alloc;
  const HostBufferPool::FreeFn free;
  const HostBufferPool::Limits limits;
  mutable absl::Mutex mu;
  bool shut ABSL_GUARDED_BY(mu) = false;
  std::map<int64_t, std::vector<uint8_t*>> idle ABSL_GUARDED_BY(mu);  // by class
  std::map<uint8_t*, int64_t> lent ABSL_GUARDED_BY(mu);               // base -> class
  HostBufferPool::Stats stats ABSL_GUARDED_BY(mu);
};

HostLease& HostLease::operator=(HostLease&& o) noexcept {
  if (this != &o) {
    Reset();
    pool_ = std::move(o.pool_);
    data_ = std::exchange(o.data_, nullptr);
    size_ = std::exchange(o.size_, 0);
    capacity_ = std::exchange(o.capacity_, 0);
  }
  return *this;
}

void HostLease::Reset() {
  if (data_ != nullptr) pool_->Give(data_, capacity_);
  pool_.reset();
  data_ = nullptr;
  size_ = 0;
  capacity_ = 0;
}

HostBufferPool::HostBufferPool(AllocFn alloc, FreeFn free, bool pinned, Limits limits)
    : state_(std::make_shared<HostLease::State>(std::move(alloc), std::move(free), limits)),
      pinned_(pinned) {}

std::unique_ptr<HostBufferPool> HostBufferPool::Heap(Limits limits) {
  return std::make_unique<HostBufferPool>(
      [](size_t n) { return std::aligned_alloc(4096, n); }, [](void* p) { std::free(p); },
      /*pinned=*/false, limits);
}

HostBufferPool::~HostBufferPool() { Shutdown(); }

int64_t HostBufferPool::SizeClass(int64_t bytes) {
  int64_t c = 4096;
  while (c < bytes) c <<= 1;
  return c;
}

HostLease HostBufferPool::Lend(int64_t bytes) {
  HostLease l;
  if (bytes <= 0) return l;
  const int64_t cap = SizeClass(bytes);
  uint8_t* p = state_->Take(cap);
  if (p == nullptr) return l;
  l.pool_ = state_;
  l.data_ = p;
  l.size_ = bytes;
  l.capacity_ = cap;
  return l;
}

bool HostBufferPool::Contains(const void* p, int64_t bytes) const {
  if (p == nullptr || bytes <= 0) return false;
  return state_->Contains(p, bytes);
}

void HostBufferPool::Shutdown() { state_->Shutdown(); }

HostBufferPool::Stats HostBufferPool::stats() const {
  absl::MutexLock lock(&state_->mu);
  Stats s = state_->stats;
  s.lent = static_cast<int>(state_->lent.size());
  return s;
}

std::string HostBufferPool::Describe() const {
  const Stats s = stats();
  return absl::StrCat(pinned_ ? "pinned" : "heap", ", at most ", state_->limits.max_buffers,
                      " buffers / ", state_->limits.max_bytes >> 20, " MiB; ", s.buffers,
                      " buffers (", s.lent, " lent), ", s.bytes >> 10, " KiB");
}

}  // namespace indexer

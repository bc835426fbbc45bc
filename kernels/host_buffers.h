// Host buffers a backend lends to its callers: the daemon copies inline
// tensors from gRPC's received slices straight into one, and a layer's
// top-k lands in one that the reply then sends as its own slice. On the gpu
// backend the buffers are pinned (page-locked), so uploads and downloads
// from and to them skip the backend's own staging copy; on the cpu backend
// they are plain heap memory.
//
// Bounded: at most `max_buffers` buffers and `max_bytes` bytes exist at once
// (lent and idle together). Buffers are kept by size class (powers of two,
// 4 KiB at least) and reused; an idle buffer of another class is freed when
// a new one would cross a bound. When the bounds leave no room, Lend returns
// an empty lease and the caller takes its copying path instead: the pool
// never blocks and never fails a request.
//
// Thread safety: all methods may be called concurrently; a HostLease is
// owned by one thread at a time. Lifetime: leases keep the pool's state
// alive; a lease returned after Shutdown frees its buffer at once.
#pragma once

#include <cstdint>
#include <functional>
#include <memory>
#include <string>

namespace indexer {

class HostBufferPool;

// One lent buffer; gives it back to the pool when destroyed or Reset.
class HostLease {
 public:
  HostLease() = default;
  HostLease(HostLease&& o) noexcept { *this = std::move(o); }
  HostLease& operator=(HostLease&& o) noexcept;
  HostLease(const HostLease&) = delete;
  HostLease& operator=(const HostLease&) = delete;
  ~HostLease() { Reset(); }

  explicit operator bool() const { return data_ != nullptr; }
  uint8_t* data() const { return data_; }
  int64_t size() const { return size_; }          // what was asked for
  int64_t capacity() const { return capacity_; }  // the buffer's size class
  void Reset();

 private:
  friend class HostBufferPool;
  struct State;
  std::shared_ptr<State> pool_;
  uint8_t* data_ = nullptr;
  int64_t size_ = 0;
  int64_t capacity_ = 0;
};

class HostBufferPool {
 public:
  struct Limits {
    int max_buffers = 16;
    int64_t max_bytes = int64_t{256} << 20;
  };
  // Allocates `bytes` (null on failure) / frees what Alloc returned.
  using AllocFn = std::function<void*(size_t bytes)>;
  using FreeFn = std::function<void(void* p)>;

  // `pinned` says what the buffers are (for logs and Contains' callers).
  HostBufferPool(AllocFn alloc, FreeFn free, bool pinned, Limits limits);
  // Plain heap buffers (the cpu backend's pool, tests).
  static std::unique_ptr<HostBufferPool> Heap(Limits limits);
  static std::unique_ptr<HostBufferPool> Heap() { return Heap(Limits()); }
  ~HostBufferPool();  // Shutdown()

  HostBufferPool(const HostBufferPool&) = delete;
  HostBufferPool& operator=(const HostBufferPool&) = delete;

  // A buffer of at least `bytes` (> 0) bytes, or an empty lease when the
  // bounds leave no room (or the allocation fails, or after Shutdown).
  HostLease Lend(int64_t bytes);

  // True when [p, p + bytes) lies within one buffer currently lent: the gpu
  // backend then copies to or from it directly (it is pinned memory).
  bool Contains(const void* p, int64_t bytes) const;

  bool pinned() const { return pinned_; }

  // Frees the idle buffers; buffers still lent are freed when returned.
  // Nothing is lent after this.
  void Shutdown();

  struct Stats {
    int buffers = 0;       // existing now, lent and idle
    int lent = 0;          // lent now
    int64_t bytes = 0;     // of all existing buffers
    int64_t lends = 0;     // leases handed out, all time
    int64_t reuses = 0;    // of which served by an idle buffer
    int64_t refusals = 0;  // empty leases (bounds or allocation failure)
  };
  Stats stats() const;
  // "pinned, 3 buffers (1 lent), 12 MiB": for the start log.
  std::string Describe() const;

  // The size class of a request: the power of two >= bytes, >= 4 KiB.
  static int64_t SizeClass(int64_t bytes);

 private:
  std::shared_ptr<HostLease::State> state_;
  const bool pinned_;
};

}  // namespace indexer

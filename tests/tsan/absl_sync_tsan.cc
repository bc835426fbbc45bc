// ThreadSanitizer builds only (INDEXER_TSAN): makes Debian's absl::Mutex
// visible to TSan. libabsl_synchronization is not instrumented, so TSan sees
// neither its locks nor the happens-before they create, and reports every
// access under an absl::Mutex (the engine's registry, gRPC's own state) as a
// race: a two-thread counter under absl::MutexLock is reported.
//
// These definitions interpose the library's exported entry points (the
// executables are linked with --export-dynamic, so callers inside libgrpc
// bind to them too), call the real ones through dlsym(RTLD_NEXT) and tell
// TSan about the lock with its mutex annotations. Only the entry points the
// project and gRPC call are covered: Lock, Unlock, ReaderLock, ReaderUnlock,
// TryLock, ReaderTryLock and CondVar::Wait / WaitWithTimeout /
// WaitWithDeadline (which release and re-take the mutex inside the library).
// The symbols are those of Debian 12's absl (inline namespace debian3).
#include <dlfcn.h>
#include <sanitizer/tsan_interface.h>

#include <cstdint>
#include <cstdio>
#include <cstdlib>

namespace {

template <typename Fn>
Fn Real(const char* name) {
  void* p = dlsym(RTLD_NEXT, name);
  if (p == nullptr) {
    std::fprintf(stderr, "absl_sync_tsan: %s not found in the next object\n", name);
    std::abort();
  }
  return reinterpret_cast<Fn>(p);
}

using MuFn = void (*)(void*);
using TryFn = bool (*)(void*);
using WaitFn = void (*)(void*, void*);
// Duration and Time are passed as their two-word representation.
struct TwoWords {
  int64_t a;
  uint32_t b;
};
using WaitTimedFn = bool (*)(void*, void*, TwoWords);

}  // namespace

#define ABSL_SYM(x) "_ZN4absl7debian3" x

extern "C" {

void _ZN4absl7debian35Mutex4LockEv(void* mu) {
  static MuFn real = Real<MuFn>(ABSL_SYM("5Mutex4LockEv"));
  __tsan_mutex_pre_lock(mu, 0);
  real(mu);
  __tsan_mutex_post_lock(mu, 0, 0);
}

void _ZN4absl7debian35Mutex6UnlockEv(void* mu) {
  static MuFn real = Real<MuFn>(ABSL_SYM("5Mutex6UnlockEv"));
  __tsan_mutex_pre_unlock(mu, 0);
  real(mu);
  __tsan_mutex_post_unlock(mu, 0);
}

void _ZN4absl7debian35Mutex10ReaderLockEv(void* mu) {
  static MuFn real = Real<MuFn>(ABSL_SYM("5Mutex10ReaderLockEv"));
  __tsan_mutex_pre_lock(mu, __tsan_mutex_read_lock);
  real(mu);
  __tsan_mutex_post_lock(mu, __tsan_mutex_read_lock, 0);
}

void _ZN4absl7debian35Mutex12ReaderUnlockEv(void* mu) {
  static MuFn real = Real<MuFn>(ABSL_SYM("5Mutex12ReaderUnlockEv"));
  __tsan_mutex_pre_unlock(mu, __tsan_mutex_read_lock);
  real(mu);
  __tsan_mutex_post_unlock(mu, __tsan_mutex_read_lock);
}

bool _ZN4absl7debian35Mutex7TryLockEv(void* mu) {
  static TryFn real = Real<TryFn>(ABSL_SYM("5Mutex7TryLockEv"));
  __tsan_mutex_pre_lock(mu, __tsan_mutex_try_lock);
  const bool ok = real(mu);
  __tsan_mutex_post_lock(mu, ok ? __tsan_mutex_try_lock : __tsan_mutex_try_lock_failed, 0);
  return ok;
}

bool _ZN4absl7debian35Mutex13ReaderTryLockEv(void* mu) {
  static TryFn real = Real<TryFn>(ABSL_SYM("5Mutex13ReaderTryLockEv"));
  const unsigned f = __tsan_mutex_read_lock | __tsan_mutex_try_lock;
  __tsan_mutex_pre_lock(mu, f);
  const bool ok = real(mu);
  __tsan_mutex_post_lock(mu, ok ? f : f | __tsan_mutex_try_lock_failed, 0);
  return ok;
}

// CondVar waits release the mutex and take it again before they return.
void _ZN4absl7debian37CondVar4WaitEPNS0_5MutexE(void* cv, void* mu) {
  static WaitFn real = Real<WaitFn>(ABSL_SYM("7CondVar4WaitEPNS0_5MutexE"));
  __tsan_mutex_pre_unlock(mu, 0);
  __tsan_mutex_post_unlock(mu, 0);
  real(cv, mu);
  __tsan_mutex_pre_lock(mu, 0);
  __tsan_mutex_post_lock(mu, 0, 0);
}

bool _ZN4absl7debian37CondVar15WaitWithTimeoutEPNS0_5MutexENS0_8DurationE(void* cv, void* mu,
                                                                          TwoWords d) {
  static WaitTimedFn real =
      Real<WaitTimedFn>(ABSL_SYM("7CondVar15WaitWithTimeoutEPNS0_5MutexENS0_8DurationE"));
  __tsan_mutex_pre_unlock(mu, 0);
  __tsan_mutex_post_unlock(mu, 0);
  const bool r = real(cv, mu, d);
  __tsan_mutex_pre_lock(mu, 0);
  __tsan_mutex_post_lock(mu, 0, 0);
  return r;
}

bool _ZN4absl7debian37CondVar16WaitWithDeadlineEPNS0_5MutexENS0_4TimeE(void* cv, void* mu,
                                                                       TwoWords t) {
  static WaitTimedFn real =
      Real<WaitTimedFn>(ABSL_SYM("7CondVar16WaitWithDeadlineEPNS0_5MutexENS0_4TimeE"));
  __tsan_mutex_pre_unlock(mu, 0);
  __tsan_mutex_post_unlock(mu, 0);
  const bool r = real(cv, mu, t);
  __tsan_mutex_pre_lock(mu, 0);
  __tsan_mutex_post_lock(mu, 0, 0);
  return r;
}

}  // extern "C"

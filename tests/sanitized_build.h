// Whether this test binary was built with AddressSanitizer or
// ThreadSanitizer (deploy/test.sh's sanitize and tsan stages): their
// allocators replace glibc malloc, and their instrumentation slows every
// call, so tests of malloc settings skip and latency bounds widen.
#pragma once

namespace indexer::testing {

#if defined(__SANITIZE_ADDRESS__) || defined(__SANITIZE_THREAD__)
inline constexpr bool kSanitized = true;
#elif defined(__has_feature)
#if __has_feature(address_sanitizer) || __has_feature(thread_sanitizer)
inline constexpr bool kSanitized = true;
#else
inline constexpr bool kSanitized = false;
#endif
#else
inline constexpr bool kSanitized = false;
#endif

}  // namespace indexer::testing

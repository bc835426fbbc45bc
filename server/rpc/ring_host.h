// Request rings (AttachRing, feature "host_ring"): Step messages through a
// host region the client registered, with no gRPC in the loop. The layout
// and the futex protocol are proto/ring_wire.h's.
//
// One worker thread per attached ring polls the ring for `spin_us`, then
// sleeps on its futex (waking every kPollMs to check its region and the
// step's idle time). Each request runs through a StepSession, the same step
// logic as the Step stream's; the worker writes the reply into the
// response slot.
//
// Ownership and lifetime: a ring belongs to the owner that attached it
// (the owner rule of regions: identity, else the connection) and pins its
// region's mapping while attached. It is detached, rolling back an open
// step, by Detach, by DetachRegion (the service calls it before it
// unregisters a region), when its region is no longer the owner's (expired
// lease: the client went away), and by the destructor. A step with no
// message for `step_idle` is rolled back (the ring stays attached).
//
// Limits: one ring per region, kMaxPerClient per owner, kMaxRings in all.
//
// Thread safety: RingHost is thread-safe.
#pragma once

#include <chrono>
#include <cstdint>
#include <map>
#include <memory>
#include <string>

#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"
#include "server/rpc/step_session.h"

namespace indexer {

class RingHost {
 public:
  static constexpr int kMaxPerClient = 8;
  static constexpr int kMaxRings = 64;
  // How often a sleeping worker checks its region and its step's idle time.
  static constexpr int kPollMs = 50;

  // REQUIRES: `services` outlive the host.
  RingHost(const StepServices& services, uint32_t spin_us, std::chrono::milliseconds step_idle);
  // Detaches every ring (open steps roll back).
  ~RingHost();

  uint32_t spin_us() const { return spin_us_; }

  // Attaches the ring at `offset` of host region `region` of `owner`.
  // Errors name the field, and nothing is attached: NOT_FOUND (region: not
  // the owner's), INVALID_ARGUMENT (offset alignment, a device region,
  // ring.magic / ring.version / ring.slot_count / ring.slot_bytes, a ring
  // past the region's end), ALREADY_EXISTS (a ring on that region),
  // RESOURCE_EXHAUSTED (the limits).
  absl::StatusOr<uint64_t> Attach(const std::string& client, const std::string& owner,
                                  const std::string& peer, uint64_t region, uint64_t offset);
  // Detaches `ring` of `owner`, waiting for its worker; returns whether an
  // open step was rolled back. NOT_FOUND for another owner's or unknown ring.
  absl::StatusOr<bool> Detach(const std::string& owner, uint64_t ring);
  // Detaches the ring on `region` of `owner`, if any.
  void DetachRegion(const std::string& owner, uint64_t region);

  // Rings attached now (detached ones whose worker has ended are dropped).
  size_t size();

 private:
  class Ring;
  // Joins and drops rings whose worker ended on its own.
  void ReapLocked() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);

  const StepServices services_;
  const uint32_t spin_us_;
  const std::chrono::milliseconds step_idle_;
  absl::Mutex mu_;
  uint64_t next_id_ ABSL_GUARDED_BY(mu_) = 1;
  std::map<uint64_t, std::unique_ptr<Ring>> rings_ ABSL_GUARDED_BY(mu_);
};

}  // namespace indexer

// A request ring to indexerd (feature "host_ring"): the step API of
// StepSession with no gRPC in the loop. The channel creates a POSIX
// shared-memory object holding the ring (proto/ring_wire.h) and a data area
// for the tensors, registers it as a host region and attaches the ring over
// gRPC; from then on each step message is written into the ring and its
// answer read back from it, the daemon's worker and this thread waking each
// other through a futex only when the other sleeps. The daemon must run on
// this host.
//
// Ordering: tensors the requests reference (data(), or any other region of
// the client) must be complete when the request is posted; a layer's
// topk_out is complete when RunLayer returns.
//
// Errors: as StepSession's; after an error the daemon has rolled the step
// back and the channel takes the next Begin. A ring the daemon let go of
// (DetachRing, its region unregistered or expired) answers FAILED_PRECONDITION.
//
// Thread safety: not thread-safe; one thread drives a channel. Lifetime:
// the IndexerClient passed to Open must outlive the channel (the
// destructor detaches and unregisters through it).
#pragma once

#include <cstddef>
#include <cstdint>
#include <memory>
#include <string>

#include "absl/status/statusor.h"
#include "absl/time/time.h"
#include "indexer/client.h"

namespace indexer::client {

struct RingOptions {
  uint32_t slot_count = 8;           // power of two, 1..1024
  uint32_t slot_bytes = 64 << 10;    // multiple of 64, >= 1024
  size_t data_bytes = 0;             // the data area after the ring
  // This thread polls for an answer this long before it sleeps on the futex.
  // A spin that covers the daemon's time saves the wake-up (a few us); one
  // that does not costs a core for nothing, and on a host with no core to
  // spare it slows the daemon: measured on 2 loaded cores, 0 beat 50 and 200.
  absl::Duration spin = absl::ZeroDuration();
  // A message not answered within this: DEADLINE_EXCEEDED.
  absl::Duration timeout = absl::Seconds(300);
  // The shared-memory object's name ("" = "/indexer-ring-<pid>-<n>").
  std::string shm_name;
};

class RingChannel {
 public:
  // Creates the region, registers it with `client` and attaches the ring.
  static absl::StatusOr<std::unique_ptr<RingChannel>> Open(IndexerClient* client,
                                                           const RingOptions& options = {});
  // Detach(), then unregisters the region and unmaps it.
  ~RingChannel();
  RingChannel(const RingChannel&) = delete;
  RingChannel& operator=(const RingChannel&) = delete;

  uint64_t region() const { return region_; }  // the registered region
  uint64_t ring() const { return ring_; }      // the attached ring's id
  uint32_t server_spin_us() const { return server_spin_us_; }
  // The data area: tensors go here and are referenced as (region(),
  // data_offset() + x, bytes); offsets 16-byte aligned.
  uint8_t* data() const;
  uint64_t data_offset() const { return data_offset_; }
  size_t data_bytes() const { return data_bytes_; }

  // The step API. Begin posts the header without waiting: its answer (an
  // error in the header) is read by the next call.
  absl::Status Begin(const v1::StepHeader& header);
  absl::StatusOr<v1::LayerReply> RunLayer(const v1::LayerRequest& request);
  absl::StatusOr<v1::StepCommitted> Commit();
  // Rolls the open step back and waits for the daemon to confirm it.
  absl::Status Abort();

  // Detaches the ring (an open step rolls back); idempotent.
  absl::Status Detach();

 private:
  struct Mapping;
  RingChannel(IndexerClient* client, const RingOptions& options);
  // Posts a request (waiting for room); returns its number.
  absl::StatusOr<uint32_t> Post(const v1::StepRequest& request);
  // Reads every answer up to request `k`; returns k's (or the first error
  // among them).
  absl::StatusOr<v1::StepResponse> Await(uint32_t k);
  // Reads the next answer (read_); its error is also kept in pending_error_
  // when none is.
  absl::StatusOr<v1::StepResponse> ReadOne();
  // Waits until the daemon published answer `k` (resp_head > k).
  absl::Status WaitAnswer(uint32_t k);

  IndexerClient* client_;
  RingOptions options_;
  std::unique_ptr<Mapping> map_;
  uint64_t region_ = 0;
  uint64_t ring_ = 0;
  bool attached_ = false;
  uint32_t server_spin_us_ = 0;
  uint64_t data_offset_ = 0;
  size_t data_bytes_ = 0;
  uint32_t next_ = 0;  // the next request's number
  uint32_t read_ = 0;  // answers read (resp_tail)
  std::string buf_;    // a request's bytes
  absl::Status pending_error_;  // the first error of answers not yet returned
};

}  // namespace indexer::client

#include "indexer/ring_channel.h"

#include <unistd.h>

#include <atomic>
#include <cstring>
#include <new>
#include <utility>

#include "absl/strings/str_cat.h"
#include "client/shm_region.h"
#include "proto/ring_wire.h"

namespace indexer::client {
namespace {

namespace rw = ring_wire;

using rw::CpuRelax;
using rw::FutexWait;
using rw::FutexWake;

constexpr uint64_t kPage = 4096;
uint64_t RoundUp(uint64_t v, uint64_t to) { return (v + to - 1) / to * to; }

std::string DefaultShmName() {
  static std::atomic<int> n{0};
  return absl::StrCat("/indexer-ring-", getpid(), "-", n.fetch_add(1));
}

}  // namespace

struct RingChannel::Mapping {
  ShmRegion shm;
  rw::RingHeader* header = nullptr;
};

RingChannel::RingChannel(IndexerClient* client, const RingOptions& options)
    : client_(client), options_(options) {}

uint8_t* RingChannel::data() const { return map_->shm.data() + data_offset_; }

absl::StatusOr<std::unique_ptr<RingChannel>> RingChannel::Open(IndexerClient* client,
                                                               const RingOptions& options) {
  std::unique_ptr<RingChannel> ch(new RingChannel(client, options));
  const uint64_t ring_bytes = rw::RingBytes(options.slot_count, options.slot_bytes);
  ch->data_offset_ = RoundUp(ring_bytes, kPage);
  ch->data_bytes_ = options.data_bytes;
  const uint64_t total = RoundUp(ch->data_offset_ + options.data_bytes, kPage);
  ch->map_ = std::make_unique<Mapping>();
  const std::string name = options.shm_name.empty() ? DefaultShmName() : options.shm_name;
  auto shm = ShmRegion::Create(name, total);
  if (!shm.ok()) return shm.status();
  ch->map_->shm = std::move(*shm);
  // A fresh object is zero-filled: every counter starts at 0.
  auto* h = new (ch->map_->shm.data()) rw::RingHeader();
  h->magic = rw::kMagic;
  h->version = rw::kVersion;
  h->slot_count = options.slot_count;
  h->slot_bytes = options.slot_bytes;
  ch->map_->header = h;
  auto reg = client->RegisterHostRegion("ring", name, 0, total);
  if (!reg.ok()) return reg.status();
  ch->region_ = reg->region();
  auto att = client->AttachRing(ch->region_, 0);
  if (!att.ok()) return att.status();  // the destructor unregisters the region
  ch->ring_ = att->ring();
  ch->server_spin_us_ = att->spin_us();
  ch->attached_ = true;
  return ch;
}

RingChannel::~RingChannel() {
  (void)Detach();
  if (region_ != 0) (void)client_->UnregisterRegion(region_);
}

absl::Status RingChannel::Detach() {
  if (!attached_) return absl::OkStatus();
  attached_ = false;
  return client_->DetachRing(ring_).status();
}

absl::StatusOr<uint32_t> RingChannel::Post(const v1::StepRequest& request) {
  rw::RingHeader* h = map_->header;
  if (!attached_ || h->detached.load(std::memory_order_acquire) != 0) {
    return absl::FailedPreconditionError("ring: detached by the daemon or by Detach()");
  }
  const uint32_t n = options_.slot_count;
  const uint32_t room = options_.slot_bytes - rw::kSlotHeaderBytes;
  buf_.clear();
  if (!request.SerializeToString(&buf_)) {
    return absl::InvalidArgumentError("request: could not serialize the StepRequest");
  }
  if (buf_.size() > room) {
    return absl::InvalidArgumentError(absl::StrCat(
        "request: ", buf_.size(), " bytes exceed the ring's slot (", room,
        " bytes of payload); put the tensors in a region and reference them"));
  }
  // Room in both rings: every request has one answer, read in order.
  while (next_ - read_ >= n) {
    // An earlier answer (a header's) still unread: read it now, keeping its
    // error for the next Await.
    const uint32_t before = read_;
    auto earlier = ReadOne();
    if (read_ == before) {  // no answer came (detached, timeout)
      pending_error_ = absl::OkStatus();
      return earlier.status();
    }
  }
  const uint32_t k = next_;
  uint8_t* slot = map_->shm.data() + rw::RequestSlotOffset(n, options_.slot_bytes, k);
  const rw::SlotHeader sh{static_cast<uint32_t>(buf_.size()), 0, k, 0};
  std::memcpy(slot, &sh, sizeof(sh));
  std::memcpy(slot + rw::kSlotHeaderBytes, buf_.data(), buf_.size());
  h->req_head.store(k + 1, std::memory_order_seq_cst);
  if (h->server_sleeping.load(std::memory_order_seq_cst) != 0) FutexWake(&h->req_head);
  ++next_;
  return k;
}

absl::Status RingChannel::WaitAnswer(uint32_t k) {
  rw::RingHeader* h = map_->header;
  const absl::Time deadline = absl::Now() + options_.timeout;
  const absl::Time spin_end = absl::Now() + options_.spin;
  auto ready = [&] { return h->resp_head.load(std::memory_order_acquire) - k - 1 < (1u << 31); };
  while (!ready()) {
    if (h->detached.load(std::memory_order_acquire) != 0) {
      return absl::FailedPreconditionError(
          "ring: the daemon let go of the ring (DetachRing, or its region was unregistered "
          "or expired); the open step was rolled back");
    }
    const absl::Time now = absl::Now();
    if (now >= deadline) {
      return absl::DeadlineExceededError(absl::StrCat(
          "ring: no answer to message ", k, " within ", absl::FormatDuration(options_.timeout)));
    }
    if (now < spin_end) {
      CpuRelax();
      continue;
    }
    const uint32_t seen = h->resp_head.load(std::memory_order_relaxed);
    h->client_sleeping.store(1, std::memory_order_seq_cst);
    if (h->resp_head.load(std::memory_order_seq_cst) == seen) FutexWait(&h->resp_head, seen, 50);
    h->client_sleeping.store(0, std::memory_order_relaxed);
  }
  return absl::OkStatus();
}

absl::StatusOr<v1::StepResponse> RingChannel::ReadOne() {
  rw::RingHeader* h = map_->header;
  const uint32_t i = read_;
  absl::Status s = WaitAnswer(i);
  if (!s.ok()) {
    if (pending_error_.ok()) pending_error_ = s;
    return s;
  }
  const uint8_t* slot =
      map_->shm.data() + rw::ResponseSlotOffset(options_.slot_count, options_.slot_bytes, i);
  rw::SlotHeader sh;
  std::memcpy(&sh, slot, sizeof(sh));
  const uint32_t room = options_.slot_bytes - rw::kSlotHeaderBytes;
  const char* payload = reinterpret_cast<const char*>(slot) + rw::kSlotHeaderBytes;
  v1::StepResponse resp;
  absl::Status answer;
  if (sh.bytes > room || sh.seq != i) {
    answer = absl::InternalError(absl::StrCat("ring: answer ", i, " is malformed (", sh.bytes,
                                              " bytes, seq ", sh.seq, ")"));
  } else if (sh.code != 0) {
    answer = absl::Status(static_cast<absl::StatusCode>(sh.code),
                          absl::string_view(payload, sh.bytes));
  } else if (!resp.ParseFromArray(payload, static_cast<int>(sh.bytes))) {
    answer = absl::InternalError(absl::StrCat("ring: answer ", i, " is not a StepResponse"));
  }
  ++read_;
  h->resp_tail.store(read_, std::memory_order_release);
  if (!answer.ok()) {
    if (pending_error_.ok()) pending_error_ = answer;
    return answer;
  }
  return resp;
}

absl::StatusOr<v1::StepResponse> RingChannel::Await(uint32_t k) {
  absl::StatusOr<v1::StepResponse> last = absl::InternalError("ring: nothing awaited");
  while (read_ != k + 1) {
    const uint32_t before = read_;
    last = ReadOne();
    if (read_ == before) {  // no answer came (detached, timeout): that is the error
      pending_error_ = absl::OkStatus();
      return last.status();
    }
  }
  if (!pending_error_.ok()) {
    absl::Status first = std::move(pending_error_);
    pending_error_ = absl::OkStatus();
    return first;
  }
  return last;
}

absl::Status RingChannel::Begin(const v1::StepHeader& header) {
  v1::StepRequest r;
  *r.mutable_header() = header;
  return Post(r).status();
}

absl::StatusOr<v1::LayerReply> RingChannel::RunLayer(const v1::LayerRequest& request) {
  v1::StepRequest r;
  *r.mutable_layer() = request;
  auto k = Post(r);
  if (!k.ok()) return k.status();
  auto resp = Await(*k);
  if (!resp.ok()) return resp.status();
  if (!resp->has_layer() || resp->layer().layer() != request.layer()) {
    return absl::InternalError(
        absl::StrCat("ring: expected the reply of layer ", request.layer()));
  }
  return std::move(*resp->mutable_layer());
}

absl::StatusOr<v1::StepCommitted> RingChannel::Commit() {
  v1::StepRequest r;
  r.mutable_commit();
  auto k = Post(r);
  if (!k.ok()) return k.status();
  auto resp = Await(*k);
  if (!resp.ok()) return resp.status();
  if (!resp->has_committed()) return absl::InternalError("ring: expected StepCommitted");
  return std::move(*resp->mutable_committed());
}

absl::Status RingChannel::Abort() {
  v1::StepRequest r;
  r.mutable_abort();
  auto k = Post(r);
  if (!k.ok()) return k.status();
  return Await(*k).status();
}

}  // namespace indexer::client
